import type { Logger } from 'pino';
import type { CreateSandboxRequest, MigrateRequest, MigrateResult, NetworkPolicyRequest, SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, EdgeCreateRequest, EdgeQuiesce, EdgeSessionCarry, SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { ImageStore } from '../../image/image-store.js';
import type { LayerDigest } from '../../image/layer-store.js';
import { CREATE_LEASE_MS } from '../create-leases.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { Metrics } from '../metrics.js';
import type { StateStore } from '../state-store.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { SYSTEM, type Caller } from './callers.js';
import type { NetworkService } from './network.js';
import type { SandboxCreation } from './sandbox-creation.js';
import { migrating, type SandboxLookup } from './sandbox-lookup.js';
import { checkPolicy } from './sandbox-spec.js';

/** Why a sandbox moves: a caller, a drain, its pool above the burst threshold, or back from the burst pool. */
export type MoveCause = 'api' | 'drain' | 'burst' | 'return';

/**
 * Moving a sandbox to another edge, keeping its id, labels, project, limits, network policy (as
 * switched), trajectory and TTL. A container is held still (quiesced: frozen, and refused if it
 * runs processes unless they may be ended: they cannot move without a checkpointer), its writable
 * layer packed (pack_diff, as a snapshot, nothing scrubbed) into a layer the target fetches
 * through the blob path (a VM: its QEMU state as one blob); the source's copy is removed, the
 * sandbox started on the target from what was packed, and only then is the row swapped to the
 * target (one conditional UPDATE: store/sandbox-moves.ts). A failure before the source's copy
 * went resumes it; after, the sandbox is started again on its source from the packed state (#undo),
 * so it is on one edge or the other, never both, and never gone without a reason. While it moves,
 * its row says so (`migration`), and calls wait for the move or get a retryable SANDBOX_MIGRATING.
 */
export class MigrationService {
  constructor(
    private readonly deps: {
      store: StateStore;
      images: ImageStore;
      lookup: SandboxLookup;
      edges: EdgeRegistry;
      creation: SandboxCreation;
      network: NetworkService;
      trajectory: TrajectoryLog;
      metrics: Metrics;
      log: Logger;
      replicaId: string;
      /** Puts layers where edges read them (the cluster's registry) before an edge is asked. */
      layersReady?: (layers: readonly string[]) => Promise<void>;
    },
  ) {}

  /** Moves `id` to another edge (`req.edge`, or one placement picks in `req.pool` or its own pool). */
  async migrate(caller: Caller, id: string, req: MigrateRequest = {}, cause: MoveCause = 'api'): Promise<MigrateResult> {
    const started = performance.now();
    try {
      const result = await this.#migrate(caller, id, req, cause, started);
      this.deps.metrics.observeMigration(cause, 'moved', result.ms);
      return result;
    } catch (err) {
      const refused = err instanceof ApiError && err.status < 500;
      this.deps.metrics.observeMigration(cause, refused ? 'refused' : 'failed');
      throw err;
    }
  }

  async #migrate(caller: Caller, id: string, req: MigrateRequest, cause: MoveCause, started: number): Promise<MigrateResult> {
    const { store, edges, creation, log } = this.deps;
    const s = await this.deps.lookup.get(caller, id);
    if (s.migration) throw migrating(s);
    if (s.status !== 'running' && s.status !== 'paused')
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}: only a running or paused sandbox moves`, { id });
    const spec = (await store.sandboxes.spec<CreateSandboxRequest>(id)) ?? { image: s.imageId };
    if (spec.volumes?.length)
      throw new ApiError(
        'SANDBOX_NOT_MIGRATABLE',
        `sandbox ${id} mounts volumes of edge ${s.edge} (${spec.volumes.map((v) => v.name).join(', ')}): a volume stays on its edge, so the sandbox does too`,
        { id, volumes: spec.volumes.map((v) => v.name) },
      );
    const from = s.edge;
    const limits = creation.limitsFor(spec);
    const to = this.#target(s, spec, req, limits);
    // Renewed with the replica's create leases, every second (create-leases.ts).
    const lease = { owner: this.deps.replicaId, until: Date.now() + CREATE_LEASE_MS };
    if (!(await store.moves.begin(id, to, lease))) {
      const now = await store.sandboxes.get(id);
      if (now?.migration) throw migrating(now);
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${now?.status ?? 'gone'}: only a running or paused sandbox moves`, {
        id,
      });
    }
    // Reconcile of either edge leaves it alone meanwhile (NodeService.reconcile).
    creation.inflight.add(id);
    edges.reserve(to, limits);
    const source = edges.api(from);
    const move: MoveState = { id, from, to, sourceGone: false, moved: false };
    try {
      const quiesced = await source.quiesceSandbox(id, { endProcesses: req.restartProcesses === true });
      move.quiesced = quiesced;
      if (!quiesced.frozen) {
        const list = quiesced.processes.map((p) => `${p.pid} ${p.cmd}`).join('; ');
        throw new ApiError(
          'SANDBOX_NOT_MIGRATABLE',
          `sandbox ${id} runs ${quiesced.processes.length} process(es) besides its init (${list}): a container's processes cannot move; migrate it between steps, or pass restartProcesses: true to end them`,
          { id, processes: quiesced.processes },
        );
      }
      const heldAt = performance.now();
      const network = await this.deps.network.currentPolicy(SYSTEM, id);
      const packed = await this.#pack(source, s, spec, limits, network, quiesced.sessions ?? []);
      move.create = packed.create;
      // The source's copy goes before the target starts: two edges on one host share a sandbox's
      // cgroups (named by its id), so the target's would be frozen with the source's, and killed
      // with it. What it was lives on in the packed state; a target that fails starts it again here.
      await store.moves.stage(id, to, packed.create.layers);
      await source.killSandbox(id);
      move.sourceGone = true;
      await this.#start(edges.api(to), packed.create, quiesced.wasPaused);
      if (!(await store.moves.commit(id, to, packed.create.layers, quiesced.wasPaused ? 'paused' : 'running'))) {
        throw new ApiError('SANDBOX_NOT_FOUND', `sandbox ${id} was killed while it moved`, { id });
      }
      move.moved = true;
      const ended = quiesced.ended ? quiesced.processes : [];
      const result: MigrateResult = {
        sandbox: (await store.sandboxes.get(id)) ?? { ...s, edge: to, layers: packed.create.layers },
        from,
        to,
        ms: round(performance.now() - started),
        heldMs: round(performance.now() - heldAt),
        bytes: packed.bytes,
        endedProcesses: ended,
      };
      await this.deps.trajectory
        .append(id, {
          kind: 'sandbox.migrated',
          request: { from, to, cause, ...(req.restartProcesses ? { restartProcesses: true } : {}) },
          result: { ms: result.ms, heldMs: result.heldMs, bytes: result.bytes, endedProcesses: ended },
        })
        .catch((err: unknown) => log.warn({ err, sandbox: id }, 'the move was not logged in the trajectory'));
      log.info({ sandbox: id, from, to, cause, ms: result.ms }, 'sandbox moved');
      return result;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND' && move.sourceGone) {
        // Killed while it moved: nothing to put back, only the target's copy to remove.
        await killQuietly(edges.apiEvenIfLost(to), id, log);
        throw err;
      }
      const where = await this.#undo(move, err);
      if (err instanceof ApiError && err.status < 500 && !move.sourceGone) throw err;
      const why = err instanceof Error ? err.message : String(err);
      throw new ApiError('SANDBOX_MIGRATE_FAILED', `sandbox ${id} did not move to edge ${to} (${why}); ${where}`, {
        id,
        edge: from,
        to,
      });
    } finally {
      edges.release(to, limits, !move.moved);
      creation.inflight.delete(id);
    }
  }

  /**
   * What the sandbox is, packed where any edge can fetch it, and the create that starts it from
   * that: a container's writable layer (pack_diff, nothing scrubbed: a move keeps every file, a
   * snapshot's default leaves caches out) over its layers; a VM's memory, devices and disk as one
   * state blob (QEMU's migration stream), restored instead of booted, its processes running on.
   */
  async #pack(
    source: EdgeApi,
    s: SandboxInfo,
    spec: CreateSandboxRequest,
    limits: SandboxLimits,
    network: NetworkPolicyRequest | undefined,
    sessions: EdgeSessionCarry[],
  ): Promise<{ create: EdgeCreateRequest; bytes: number }> {
    const { config } = await this.deps.creation.composeLayers(spec, s.project ?? 'default');
    const base = {
      id: s.id,
      config,
      env: spec.env ?? {},
      limits,
      backend: s.backend,
      ...(network ? { network: checkPolicy(network) } : {}),
    };
    if (s.backend !== 'container') {
      const snap = await source.snapshotSandbox(s.id, { memory: true, portable: true });
      if (!snap.state) throw new Error(`edge ${s.edge} saved no portable state for VM ${s.id}`);
      await this.deps.layersReady?.(s.layers);
      return { create: { ...base, layers: s.layers, restoreState: snap.state.digest }, bytes: snap.state.bytes };
    }
    const snap = await source.snapshotSandbox(s.id, { scrub: [] });
    const layers = snap.layer ? [...snap.baseLayers, snap.layer] : snap.baseLayers;
    if (snap.layer) await this.deps.images.layers.fetch(snap.layer as LayerDigest);
    await this.deps.layersReady?.(layers);
    return { create: { ...base, layers, ...(sessions.length ? { sessions } : {}) }, bytes: snap.stats.bytes };
  }

  /** Starts the packed sandbox on `edge`, paused again if it was. */
  async #start(edge: EdgeApi, create: EdgeCreateRequest, paused: boolean): Promise<void> {
    await edge.createSandbox(create);
    if (paused) await edge.pauseSandbox(create.id);
  }

  /**
   * Undoes a move that did not happen, and says where the sandbox is. Before its source copy
   * went: the source resumed (unless it was paused before), the row left there. After: whatever
   * the target made is removed, and the sandbox started again on its source from the packed state
   * (its files as they were; a container had no process left to lose); should that fail too, the
   * row becomes failed with both reasons, never left naming an edge that does not run it.
   */
  async #undo(move: MoveState, cause: unknown): Promise<string> {
    const { store, edges, log } = this.deps;
    const { id, from, to, quiesced } = move;
    const why = cause instanceof Error ? cause.message : String(cause);
    log.warn({ sandbox: id, from, to, err: why }, 'a move did not happen');
    if (!move.sourceGone) {
      await store.moves.abort(id, to);
      if (quiesced?.frozen && !quiesced.wasPaused) {
        await edges
          .apiEvenIfLost(from)
          .resumeSandbox(id)
          .catch((err: unknown) =>
            log.error({ sandbox: id, edge: from, err: (err as Error).message }, 'a sandbox whose move failed was not resumed'),
          );
      }
      return `it runs on at edge ${from}`;
    }
    await killQuietly(edges.apiEvenIfLost(to), id, log);
    try {
      await this.#start(edges.api(from), move.create!, quiesced?.wasPaused === true);
      await store.moves.abort(id, to);
      return `it was started again at edge ${from} from its packed state (its files as they were)`;
    } catch (err) {
      const again = err instanceof Error ? err.message : String(err);
      await store.moves.abort(id, to);
      await store.sandboxes.setStatus(
        id,
        'failed',
        `its move from edge ${from} to edge ${to} failed (${why}) and starting it again at edge ${from} failed too (${again})`,
      );
      return `starting it again at edge ${from} failed too (${again}): it is failed`;
    }
  }

  /**
   * Settles the moves whose replica stopped renewing them (it died mid-move), run by the replica
   * that holds the expiry lease, with the creates' takeover. Where the sandbox runs decides: on
   * its target, the move is committed (it got that far); on its source, the move is given up and
   * the source resumed (a sandbox its caller paused stays paused); on neither (the replica died
   * between removing the source's copy and starting the target's), the row becomes failed with
   * the reason. An edge that cannot be asked now is asked at the next sweep.
   */
  async recoverAbandoned(now = Date.now()): Promise<{ committed: string[]; givenUp: string[]; failed: string[] }> {
    const { store, edges, log } = this.deps;
    const out = { committed: [] as string[], givenUp: [] as string[], failed: [] as string[] };
    // One listing per edge and sweep, whatever the number of moves it was part of (as CreateLeases.takeOver).
    const lists = new Map<string, Promise<Set<string> | undefined>>();
    const listOf = (edge: string): Promise<Set<string> | undefined> => {
      let list = lists.get(edge);
      if (!list) {
        list = edges.has(edge)
          ? edges
              .apiEvenIfLost(edge)
              .listSandboxes()
              .then(
                (l) => new Set(l.map((x) => x.id)),
                () => undefined,
              )
          : Promise.resolve(new Set<string>());
        lists.set(edge, list);
      }
      return list;
    };
    for (const m of await store.moves.abandoned(now)) {
      const runs = async (edge: string): Promise<boolean | undefined> => (await listOf(edge))?.has(m.id);
      const [onTarget, onSource] = [await runs(m.to), await runs(m.from)];
      if (onTarget === undefined || onSource === undefined) continue;
      const row = await store.sandboxes.get(m.id);
      const who = `its control-plane replica ${m.owner} stopped while moving it from edge ${m.from} to edge ${m.to}`;
      if (onTarget && row) {
        if (onSource) await killQuietly(edges.apiEvenIfLost(m.from), m.id, log);
        await store.moves.commit(m.id, m.to, row.layers, m.status === 'paused' ? 'paused' : 'running');
        out.committed.push(m.id);
      } else if (onSource) {
        if (m.status === 'running')
          await edges
            .apiEvenIfLost(m.from)
            .resumeSandbox(m.id)
            .catch((err: unknown) =>
              log.warn({ sandbox: m.id, err: (err as Error).message }, 'an abandoned move: the source was not resumed'),
            );
        await store.moves.abort(m.id, m.to);
        out.givenUp.push(m.id);
      } else {
        await store.moves.abort(m.id, m.to);
        await store.sandboxes.setStatus(m.id, 'failed', `${who}, after its copy there was removed and before the new one started`);
        out.failed.push(m.id);
      }
      log.warn({ sandbox: m.id, from: m.from, to: m.to, owner: m.owner, onTarget, onSource }, `settled an abandoned move: ${who}`);
    }
    return out;
  }

  /** Where it goes: the edge named (checked for room), else one placement picks in the pool named or its own. */
  #target(s: SandboxInfo, spec: CreateSandboxRequest, req: MigrateRequest, limits: SandboxLimits): string {
    const { edges, creation } = this.deps;
    if (req.edge === s.edge) throw new ApiError('INVALID_REQUEST', `sandbox ${s.id} is on edge ${s.edge} already`, { field: 'edge' });
    if (req.edge !== undefined && !edges.has(req.edge))
      throw new ApiError('EDGE_NOT_FOUND', `no edge ${req.edge} (GET /v1/nodes lists them)`, { edge: req.edge });
    const placement = { ...spec.placement, ...(req.pool ? { pool: req.pool, burst: false } : {}) };
    if (req.edge !== undefined) {
      const pool = edges.candidates().find((c) => c.id === req.edge)?.pool;
      placement.pool = pool ?? placement.pool;
      placement.burst = false;
    }
    return creation.place({ ...spec, placement }, limits, s.layers, new Set([s.edge]), req.edge);
  }
}

async function killQuietly(edge: EdgeApi, id: string, log: Logger): Promise<void> {
  await edge.killSandbox(id).catch((err: unknown) => {
    if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND'))
      log.error({ sandbox: id, err: (err as Error).message }, "a move's copy on its target was not removed; reconcile removes it");
  });
}

const round = (ms: number): number => Math.round(ms * 10) / 10;

/** A move as it goes: what undoing it must know. */
interface MoveState {
  id: string;
  from: string;
  to: string;
  quiesced?: EdgeQuiesce;
  /** How the packed sandbox is started (on the target, or again on the source). */
  create?: EdgeCreateRequest;
  /** The source's copy was removed: the packed state is all there is until a start succeeds. */
  sourceGone: boolean;
  moved: boolean;
}
