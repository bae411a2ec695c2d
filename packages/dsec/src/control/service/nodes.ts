import type { Logger } from 'pino';
import type { DrainProgress, NodeInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { SYSTEM } from './callers.js';
import type { MigrationService } from './migration.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { SandboxCreation } from './sandbox-creation.js';
import type { StateStore } from '../state-store.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { POOL_READY_LABEL } from './reserved-labels.js';

/** Moves a drain runs at once: each holds its sandbox still for a pack, a fetch and a start. */
const DRAIN_MOVES = 4;

/** The cluster's nodes as callers see them, draining one, and keeping the store in step with an edge. */
export class NodeService {
  constructor(
    private readonly deps: {
      store: StateStore;
      edges: EdgeRegistry;
      creation: SandboxCreation;
      migration: MigrationService;
      trajectory: TrajectoryLog;
      log: Logger;
    },
  ) {}

  /** Every edge, from the facts its heartbeats brought. */
  async nodes(): Promise<NodeInfo[]> {
    await this.deps.edges.refreshLocal();
    return this.deps.edges.describe().map((e) => {
      const n: NodeInfo = {
        id: e.id,
        pool: e.pool,
        labels: e.labels,
        state: e.state,
        lastSeenAt: e.lastSeenAt,
        version: e.info.version,
        sandboxes: e.info.sandboxes,
        maxSandboxes: e.info.maxSandboxes,
        cpuOvercommit: e.cpuOvercommit,
        utilisation: Math.max(
          e.info.sandboxes / e.info.maxSandboxes,
          1 - e.info.capacity.memoryAvailableBytes / e.info.capacity.memoryBytes,
        ),
        capacity: e.info.capacity,
        cachedLayers: e.info.cachedLayers.length,
        layerCache: e.info.layerCache,
      };
      if (e.url) n.url = e.url;
      return n;
    });
  }

  /** Stops new placements on an edge; a remote edge leaves once its last sandbox is gone. */
  async drain(id: string): Promise<NodeInfo> {
    await this.deps.edges.drain(id);
    return (await this.nodes()).find((n) => n.id === id)!;
  }

  /**
   * Drains an edge and moves its sandboxes off it (MigrationService.migrate, DRAIN_MOVES at a
   * time, each placed by the rules of its own pool), reporting each as it moves or stays (with
   * why: a container running processes without `restartProcesses`, volumes, no room elsewhere),
   * then the result. A remote edge left empty leaves the cluster, as after any drain.
   */
  async *drainMoving(id: string, opts: { restartProcesses?: boolean } = {}): AsyncGenerator<DrainProgress> {
    await this.deps.edges.drain(id);
    const live = (await this.deps.store.sandboxes.list({ edge: id })).filter((s) => s.status === 'running' || s.status === 'paused');
    yield { type: 'start', total: live.length };
    const moved: Extract<DrainProgress, { type: 'moved' }>[] = [];
    const stayed: Extract<DrainProgress, { type: 'stayed' }>[] = [];
    const ready: DrainProgress[] = [];
    let wake: (() => void) | undefined;
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < live.length) {
        const s = live[next++]!;
        try {
          const r = await this.deps.migration.migrate(SYSTEM, s.id, opts.restartProcesses ? { restartProcesses: true } : {}, 'drain');
          const line = { type: 'moved' as const, id: s.id, to: r.to, ms: r.ms };
          moved.push(line);
          ready.push(line);
        } catch (err) {
          const line = {
            type: 'stayed' as const,
            id: s.id,
            code: err instanceof ApiError ? err.code : 'INTERNAL',
            reason: err instanceof Error ? err.message : String(err),
          };
          stayed.push(line);
          ready.push(line);
        }
        wake?.();
      }
    };
    let finished = false;
    const all = Promise.all(Array.from({ length: Math.min(DRAIN_MOVES, live.length) }, worker)).finally(() => {
      finished = true;
      wake?.();
    });
    while (!finished || ready.length) {
      if (ready.length) {
        yield ready.shift()!;
        continue;
      }
      await new Promise<void>((r) => (wake = r));
      wake = undefined;
    }
    await all;
    const node = (await this.nodes()).find((n) => n.id === id);
    if (!node) throw new ApiError('EDGE_NOT_FOUND', `edge ${id} left the cluster during its drain`, { edge: id });
    yield { type: 'done', node, moved, stayed };
  }

  /** Marks the sandboxes of an edge that stopped answering as lost, with why. */
  async markLost(edge: string, why: string): Promise<void> {
    const lost = await this.deps.store.edges.markLost(edge, `lost: ${why}`);
    if (lost.length) this.deps.log.error({ edge, sandboxes: lost.length }, 'sandboxes of a lost edge marked lost');
  }

  /**
   * Brings the store in line with what an edge actually runs (after either restarted, or when a
   * lost edge reports again). The rule: a sandbox the edge runs and the store has as running or
   * paused is kept; one the store reported `lost` is kept too, back as the edge has it (running
   * or paused) with the gap in its trajectory (`edge.gap`), because nothing replaced it: a GC
   * pause or a network blip must not end every rollout on a node. One that was replayed
   * elsewhere meanwhile (its row `failed`, "replayed as …") is killed, as is one the store does
   * not know (no caller was ever told about it). A sandbox the store has as live but the edge
   * does not run becomes `failed` with the reason.
   */
  async reconcile(edgeId: string): Promise<{ lost: string[]; orphans: string[]; killedLost: string[]; kept: string[] }> {
    const { store, creation, log } = this.deps;
    const edge = this.deps.edges.apiEvenIfLost(edgeId);
    // A create that is in flight now may finish on the edge after it lists its sandboxes, or
    // before the store is read below: either way, that sandbox is its create's to settle.
    // On a shared store, creates another replica has in flight count too (their leases are live).
    // A sandbox moving to this edge is its move's to settle too (service/migration.ts).
    const inflight = new Set([
      ...creation.inflight,
      ...(await store.sandboxes.leasedCreates(edgeId, Date.now())),
      ...(await store.moves.leasedTo(edgeId, Date.now())),
    ]);
    const listed = await edge.listSandboxes();
    const onEdge = new Set(listed.map((s) => s.id));
    const pausedOnEdge = new Set(listed.filter((s) => s.status === 'paused').map((s) => s.id));
    const rows = await store.sandboxes.list({ edge: edgeId });
    // A create placed after the snapshot above may have finished on the edge after its list and
    // settled before the rows were read: its row says running and the list lacks it, yet it runs.
    // The edge is asked again, after that read, before any such row is failed.
    const missing = rows.filter(
      (s) => (s.status === 'running' || s.status === 'creating' || s.status === 'paused') && !onEdge.has(s.id) && !inflight.has(s.id),
    );
    const runsNow = missing.length ? new Set((await edge.listSandboxes()).map((s) => s.id)) : new Set<string>();
    const lost: string[] = [];
    const killedLost: string[] = [];
    const kept: string[] = [];
    for (const s of rows) {
      if (inflight.has(s.id) || creation.inflight.has(s.id) || runsNow.has(s.id)) {
        onEdge.delete(s.id);
        continue;
      }
      if (s.status === 'lost' && !onEdge.has(s.id)) {
        // The edge came back without it: it will not come back, and its callers must stop retrying.
        if (await store.sandboxes.setStatusIf(s.id, 'lost', 'failed', `${s.reason ?? 'lost'}; edge ${edgeId} came back without it`))
          lost.push(s.id);
        continue;
      }
      if (s.status === 'lost' && onEdge.has(s.id)) {
        // Nothing replaced it (a replay marks its original failed first): it is the caller's again,
        // unless it is a warm pool's unclaimed sandbox (the pool dropped it when its edge was lost).
        // Only from lost: a replay or a kill that won the race keeps its word (the sandbox is killed).
        const status = pausedOnEdge.has(s.id) ? 'paused' : 'running';
        const revive = s.labels[POOL_READY_LABEL] === undefined && (await store.sandboxes.setStatusIf(s.id, 'lost', status));
        if (!revive) {
          if (s.labels[POOL_READY_LABEL] !== undefined)
            await store.sandboxes.setStatusIf(s.id, 'lost', 'failed', `${s.reason ?? 'lost'}; its pool let it go`);
          await edge
            .killSandbox(s.id)
            .catch((err: unknown) => log.error({ err, sandbox: s.id }, 'killing a sandbox that was not kept failed'));
          killedLost.push(s.id);
          onEdge.delete(s.id);
          continue;
        }
        await this.deps.trajectory
          .append(s.id, { kind: 'edge.gap', request: { edge: edgeId, reason: s.reason ?? 'lost', backAt: new Date().toISOString() } })
          .catch((err: unknown) => log.warn({ err, sandbox: s.id }, 'the gap was not logged in the trajectory'));
        kept.push(s.id);
        onEdge.delete(s.id);
        continue;
      }
      if ((s.status === 'running' || s.status === 'creating' || s.status === 'paused') && !onEdge.has(s.id)) {
        await store.sandboxes.setStatus(s.id, 'failed', 'lost: the edge no longer has this sandbox (it was removed while dsec was down)');
        lost.push(s.id);
      }
      if (s.status === 'creating' && onEdge.has(s.id)) await store.sandboxes.setStatus(s.id, 'running');
      const live = s.status === 'running' || s.status === 'creating' || s.status === 'paused';
      if (!live && onEdge.has(s.id)) {
        // Replayed elsewhere, failed or stopped: the caller was told it is not running, so it must not run.
        await edge.killSandbox(s.id).catch((err: unknown) => log.error({ err, sandbox: s.id }, `killing a ${s.status} sandbox failed`));
        killedLost.push(s.id);
      }
      onEdge.delete(s.id);
    }
    // Sandboxes no caller was ever told about: kill them rather than leak them.
    const orphans = [...onEdge];
    for (const id of orphans)
      await edge.killSandbox(id).catch((err: unknown) => log.error({ err, sandbox: id }, 'killing an orphan failed'));
    if (lost.length || orphans.length || killedLost.length || kept.length)
      log.warn({ edge: edgeId, lost, orphans, killedLost, kept }, 'reconciled state store with edge');
    return { lost, orphans, killedLost, kept };
  }
}
