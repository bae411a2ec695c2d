import type { Logger } from 'pino';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeApi } from '../../edge/protocol/edge-api.js';
import { isDiskFull } from '../../host/disk-space.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { EndedSandboxes } from '../ended-sandboxes.js';
import type { StateStore } from '../state-store.js';
import { sees, type Caller } from './callers.js';

/** How long a call on a moving sandbox waits for the move before SANDBOX_MIGRATING (the SDKs retry that). */
export const MOVE_WAIT_MS = 3_000;

/** The refusal a call on a moving sandbox gets once it has waited: the same call succeeds after the move. */
export function migrating(s: SandboxInfo): ApiError {
  return new ApiError(
    'SANDBOX_MIGRATING',
    `sandbox ${s.id} is moving from edge ${s.edge} to edge ${s.migration?.to ?? '?'}; retry: the call succeeds once it has moved`,
    { id: s.id, retryable: true, from: s.edge, to: s.migration?.to },
  );
}

/**
 * How a service finds a sandbox and reaches its edge: the one place project scope is decided for
 * a sandbox (every service method that names one goes through `get`), and the only way to an
 * edge. Private to control/service/ (a lint rule holds it): routes and the E2B layer call
 * services, never an edge.
 */
export class SandboxLookup {
  constructor(
    private readonly deps: {
      store: StateStore;
      ended: EndedSandboxes;
      edges: EdgeRegistry;
      /** The warm pool an unclaimed sandbox waits in, if it does (warm-pools.ts). */
      unclaimedIn: (id: string) => string | undefined;
      log: Logger;
    },
  ) {}

  /**
   * The sandbox `id`, if `caller` may see it. Another project's sandbox answers exactly as one
   * that does not exist (SANDBOX_NOT_FOUND, no 403), so ids do not leak across projects
   * (docs/PROJECTS.md); a killed one whose trajectory is kept says when it went, to its project.
   */
  async get(caller: Caller, id: string): Promise<SandboxInfo> {
    const s = await this.deps.store.sandboxes.get(id);
    if (s && sees(caller, s.project)) return s;
    const ended = s ? undefined : await this.deps.ended.get(id);
    if (ended && sees(caller, await this.deps.ended.projectOf(id))) {
      throw new ApiError(
        'SANDBOX_NOT_FOUND',
        `sandbox ${id} was killed at ${ended.endedAt}; its trajectory stays readable until ${ended.keptUntil} (GET /v1/sandboxes/${id}/trajectory, dsec log ${id})`,
        { id, ...ended },
      );
    }
    throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { id });
  }

  /**
   * Throws SANDBOX_NOT_FOUND, worded as for a sandbox that does not exist, when `id` belongs to
   * another project than the caller's (a killed one's trajectory too). An id no project has
   * passes: what the caller does with it answers for it.
   */
  async assertVisible(caller: Caller, id: string): Promise<void> {
    if (caller.admin) return;
    const project = (await this.deps.store.sandboxes.projectOf(id)) ?? (await this.deps.ended.projectOf(id));
    if (project !== undefined && project !== caller.project) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { id });
  }

  /** Whether `id` is a sandbox `caller` may see, or a killed one of its project whose trajectory is still kept. */
  async trajectoryKept(caller: Caller, id: string): Promise<boolean> {
    const s = await this.deps.store.sandboxes.get(id);
    if (s) return sees(caller, s.project);
    return (await this.deps.ended.get(id)) !== undefined && sees(caller, await this.deps.ended.projectOf(id));
  }

  /** The edge a sandbox lives on (any state: a kill, a resume or a paused read). */
  edgeOf(s: SandboxInfo): EdgeApi {
    return this.deps.edges.api(s.edge);
  }

  /**
   * The sandbox as it is once a move in flight has ended (MigrationService): a call on a moving
   * sandbox waits up to MOVE_WAIT_MS for it, then is refused with the retryable SANDBOX_MIGRATING
   * (nothing was sent to either edge, so the same call can be sent again). The store is read again
   * every 25 ms: the move may be another replica's.
   */
  async settled(caller: Caller, s: SandboxInfo): Promise<SandboxInfo> {
    const until = Date.now() + MOVE_WAIT_MS;
    while (s.migration) {
      if (Date.now() >= until) throw migrating(s);
      await new Promise((r) => setTimeout(r, 25));
      s = await this.get(caller, s.id);
    }
    return s;
  }

  /** The edge of a running sandbox `caller` may see; counts as activity for the idle timeout. */
  async runningOn(caller: Caller, id: string): Promise<EdgeApi> {
    let s = await this.get(caller, id);
    if (s.migration) s = await this.settled(caller, s);
    if (s.status === 'lost')
      // Its edge stopped reporting; it may come back with the sandbox intact (a GC pause, a network
      // blip): retryable, and nothing was sent to the edge, so any call may be retried as it is.
      throw new ApiError(
        'EDGE_UNAVAILABLE',
        `sandbox ${id}'s edge ${s.edge} is not reporting (${s.reason ?? 'lost'}); retry: it is kept if the edge comes back, or replay it elsewhere (POST /v1/sandboxes/${id}/replay)`,
        { id, edge: s.edge, status: s.status, retryable: true },
      );
    if (s.status !== 'running') {
      const hint = s.status === 'paused' ? ': resume it first (POST /v1/sandboxes/{id}/resume)' : s.reason ? `: ${s.reason}` : '';
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}${hint}`, { id, status: s.status });
    }
    const pool = this.deps.unclaimedIn(id);
    if (pool !== undefined) {
      // A claimed sandbox must be one nobody used: a ready one serves no call until a create claims it.
      throw new ApiError(
        'SANDBOX_NOT_RUNNING',
        `sandbox ${id} waits unclaimed in pool ${pool}: claim one with a create naming the pool ({"pool":"${pool}",…})`,
        { id, pool },
      );
    }
    // The activity stamp only moves the idle timeout: on a full disk a read or a call that writes
    // nothing still goes through (what must be written fails on its own, with NODE_DISK_FULL).
    await this.deps.store.sandboxes.touch(id).catch((err: unknown) => {
      if (!isDiskFull(err)) throw err;
      this.deps.log.warn({ sandbox: id, err }, 'the disk is full: the activity stamp was not written');
    });
    return this.edgeOf(s);
  }
}
