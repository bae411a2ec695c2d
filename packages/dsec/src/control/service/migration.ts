import type { Logger } from 'pino';
import type { CreateSandboxRequest, MigrateRequest, MigrateResult, SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, EdgeQuiesce } from '../../edge/protocol/edge-api.js';
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
 * through the blob path, started there from its layers plus that one, and only then is the row
 * swapped to the target (one conditional UPDATE: store/sandbox-moves.ts) and the source's copy
 * removed. A failure before the swap resumes the source and removes what the target made, so the
 * sandbox is on one edge or the other, never both and never neither. While it moves, its row
 * says so (`migration`), and calls wait for the move or get a retryable SANDBOX_MIGRATING.
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
    if (s.backend !== 'container')
      throw new ApiError('SANDBOX_NOT_MIGRATABLE', `sandbox ${id} is a ${s.backend}: only container sandboxes move between edges for now`, {
        id,
        backend: s.backend,
      });
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
    let quiesced: EdgeQuiesce | undefined;
    /** The target may hold a copy (its create was sent), and the row does not name it. */
    let made = false;
    let moved = false;
    try {
      quiesced = await source.quiesceSandbox(id, { endProcesses: req.restartProcesses === true });
      if (!quiesced.frozen) {
        const list = quiesced.processes.map((p) => `${p.pid} ${p.cmd}`).join('; ');
        throw new ApiError(
          'SANDBOX_NOT_MIGRATABLE',
          `sandbox ${id} runs ${quiesced.processes.length} process(es) besides its init (${list}): a container's processes cannot move; migrate it between steps, or pass restartProcesses: true to end them`,
          { id, processes: quiesced.processes },
        );
      }
      const frozenAt = performance.now();
      const network = await this.deps.network.currentPolicy(SYSTEM, id);
      // Nothing scrubbed: a move keeps every file (a snapshot's default leaves caches out).
      const snap = await source.snapshotSandbox(id, { scrub: [] });
      const layers = snap.layer ? [...snap.baseLayers, snap.layer] : snap.baseLayers;
      if (snap.layer) await this.deps.images.layers.fetch(snap.layer as LayerDigest);
      await this.deps.layersReady?.(layers);
      const { config } = await creation.composeLayers(spec, s.project ?? 'default');
      const target = edges.api(to);
      made = true;
      await target.createSandbox({
        id,
        layers,
        config,
        env: spec.env ?? {},
        limits,
        backend: s.backend,
        ...(network ? { network: checkPolicy(network) } : {}),
      });
      if (quiesced.wasPaused) await target.pauseSandbox(id);
      if (!(await store.moves.commit(id, to, layers, quiesced.wasPaused ? 'paused' : 'running'))) {
        throw new ApiError('SANDBOX_NOT_FOUND', `sandbox ${id} was killed while it moved`, { id });
      }
      made = false; // the target's copy is the sandbox now
      moved = true;
      const ms = performance.now() - started;
      const heldMs = performance.now() - frozenAt;
      // The source's copy: a failure here leaves an orphan its edge's next reconcile kills (the row names the target).
      await source
        .killSandbox(id)
        .catch((err: unknown) =>
          log.warn(
            { sandbox: id, edge: from, err: (err as Error).message },
            'the source copy of a moved sandbox was not removed; reconcile removes it',
          ),
        );
      const ended = quiesced.ended ? quiesced.processes : [];
      const result: MigrateResult = {
        sandbox: (await store.sandboxes.get(id)) ?? { ...s, edge: to, layers },
        from,
        to,
        ms: round(ms),
        heldMs: round(heldMs),
        bytes: snap.stats.bytes,
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
      await this.#undo(id, from, to, quiesced, made, err);
      if (err instanceof ApiError && err.status < 500) throw err;
      const why = err instanceof Error ? err.message : String(err);
      throw new ApiError('SANDBOX_MIGRATE_FAILED', `sandbox ${id} did not move to edge ${to} (${why}); it runs on at edge ${from}`, {
        id,
        edge: from,
        to,
      });
    } finally {
      edges.release(to, limits, !moved);
      creation.inflight.delete(id);
    }
  }

  /**
   * Undoes a move that did not happen: what the target made is removed, the row stays on its
   * source (the move mark cleared), and the source is resumed unless it was paused before.
   */
  async #undo(id: string, from: string, to: string, quiesced: EdgeQuiesce | undefined, made: boolean, cause: unknown): Promise<void> {
    const { store, edges, log } = this.deps;
    if (made) await killQuietly(edges.apiEvenIfLost(to), id, log);
    await store.moves.abort(id, to);
    if (quiesced?.frozen && !quiesced.wasPaused) {
      await edges
        .apiEvenIfLost(from)
        .resumeSandbox(id)
        .catch((err: unknown) =>
          log.error({ sandbox: id, edge: from, err: (err as Error).message }, 'a sandbox whose move failed was not resumed'),
        );
    }
    log.warn({ sandbox: id, from, to, err: cause instanceof Error ? cause.message : String(cause) }, 'a move did not happen');
  }

  /**
   * Gives up the moves whose replica stopped renewing them (it died mid-move): the target's copy
   * is removed, the source resumed (a sandbox paused by its caller stays paused), the row left on
   * its source. Run by the replica that holds the expiry lease, with the creates' takeover.
   */
  async recoverAbandoned(now = Date.now()): Promise<string[]> {
    const { store, edges, log } = this.deps;
    const given: string[] = [];
    for (const m of await store.moves.abandoned(now)) {
      if (edges.has(m.to)) await killQuietly(edges.apiEvenIfLost(m.to), m.id, log);
      if (m.status === 'running' && edges.has(m.from)) {
        await edges
          .apiEvenIfLost(m.from)
          .resumeSandbox(m.id)
          .catch((err: unknown) =>
            log.warn({ sandbox: m.id, edge: m.from, err: (err as Error).message }, 'an abandoned move: the source was not resumed'),
          );
      }
      await store.moves.abort(m.id, m.to);
      log.warn(
        { sandbox: m.id, from: m.from, to: m.to, owner: m.owner },
        'gave up a move whose replica stopped renewing it; it stays on its source',
      );
      given.push(m.id);
    }
    return given;
  }

  /** Where it goes: the edge named (checked for room), else one placement picks in the pool named or its own. */
  #target(s: SandboxInfo, spec: CreateSandboxRequest, req: MigrateRequest, limits: ReturnType<SandboxCreation['limitsFor']>): string {
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
