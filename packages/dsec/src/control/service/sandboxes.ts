import type { Logger } from 'pino';
import type { CreateSandboxRequest, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { ImageId } from '../../image/image-store.js';
import type { EndedSandboxes } from '../ended-sandboxes.js';
import type { Metrics } from '../metrics.js';
import type { ProjectImages } from '../project-images.js';
import type { ProjectQuotas } from '../project-quotas.js';
import type { CreateOptions, SandboxCreation } from './sandbox-creation.js';
import type { SnapshotImages } from '../snapshot-images.js';
import type { SandboxFilter, StateStore } from '../state-store.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { WarmPools } from './pools.js';
import { sees, type Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import { refuseReservedLabels } from './reserved-labels.js';

/** The reason of a sandbox whose kill left resources on its node; a kill retries it. */
const KILL_FAILED_REASON = 'kill failed, resources remain: ';

/** What a caller may narrow a page of the list by (the edge is the control plane's own filter). */
type PageFilter = Omit<SandboxFilter, 'edge'>;

/** The filter as the store applies it: a caller's own project, whatever it asked; an admin key's, the one it names or all. */
function scoped(caller: Caller, filter: PageFilter): SandboxFilter {
  const project = caller.admin ? filter.project : caller.project;
  const { project: _asked, ...rest } = filter;
  return project === undefined ? rest : { ...rest, project };
}

export interface SandboxServiceDeps {
  store: StateStore;
  lookup: SandboxLookup;
  creation: SandboxCreation;
  pools: () => WarmPools;
  quotas: ProjectQuotas;
  projectImages: ProjectImages;
  snapshotImages: SnapshotImages;
  ended: EndedSandboxes;
  trajectory: TrajectoryLog;
  metrics: Metrics;
  log: Logger;
}

/**
 * A sandbox's life: create (or a warm pool's claim), read, list, pause, resume, expiry and kill.
 * Every method that names a sandbox takes the caller and answers for another project's sandbox as
 * for one that does not exist.
 */
export class SandboxService {
  constructor(private readonly deps: SandboxServiceDeps) {}

  /**
   * Creates one sandbox in the caller's project (`opts.project` names another only for dsec's own
   * callers: a fork's or replay's parent project), or claims a ready one from the warm pool the
   * request names or matches (a batch's items are always created).
   */
  create(
    caller: Caller,
    req: CreateSandboxRequest,
    extraLabels: Record<string, string> = {},
    opts: CreateOptions = {},
  ): Promise<SandboxInfo> {
    // Not async: a create that names no pool returns SandboxCreation's promise as it is (one
    // promise less per create; a refusal is a rejected promise all the same).
    try {
      if (opts.project !== undefined && !sees(caller, opts.project))
        throw new ApiError('FORBIDDEN', `a create in project ${opts.project} takes that project's key or an admin key`, {
          project: opts.project,
        });
      opts = { ...opts, project: opts.project ?? caller.project };
      const pool = opts.batch ? undefined : this.deps.pools().poolFor(req);
      if (pool !== undefined) return this.#claimOrCreate(req, pool, extraLabels, opts);
      return this.#create(req, extraLabels, opts);
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  async #claimOrCreate(
    req: CreateSandboxRequest,
    pool: string,
    extraLabels: Record<string, string>,
    opts: CreateOptions,
  ): Promise<SandboxInfo> {
    // A claim is a create for the project's quotas: it moves a ready sandbox into the project.
    const project = opts.project!;
    const pools = this.deps.pools();
    const claimed = await this.deps.quotas.admit(project, this.limitsFor(req), 1, () => pools.claim(req, project, opts.accessToken), {
      pace: opts.pace === true,
    });
    if (claimed) {
      this.deps.metrics.poolClaim(project, pool);
      return claimed;
    }
    return this.#create(req, extraLabels, { ...opts, rateTaken: true });
  }

  #create(req: CreateSandboxRequest, extraLabels: Record<string, string>, opts: CreateOptions): Promise<SandboxInfo> {
    const { pool: _pool, ...spec } = req;
    return this.deps.creation.create(spec, { ...extraLabels, ...WarmPools.missLabels(req) }, opts);
  }

  /** Creates a batch's group of sandboxes (dsec's batch driver only): see SandboxCreation.createGroup. */
  createGroup(...args: Parameters<SandboxCreation['createGroup']>): ReturnType<SandboxCreation['createGroup']> {
    return this.deps.creation.createGroup(...args);
  }

  limitsFor(req: CreateSandboxRequest): SandboxLimits {
    return this.deps.creation.limitsFor(req);
  }

  /** Everything about a spec that can be checked without placing it: labels, image, layers, network syntax. */
  async checkSpec(req: CreateSandboxRequest, project: string): Promise<void> {
    refuseReservedLabels(req.labels);
    await this.deps.creation.checkSpec(req, project);
  }

  /** See SandboxLookup.assertVisible: the access pipeline's check before a sandbox route's handler. */
  assertVisible(caller: Caller, id: string): Promise<void> {
    return this.deps.lookup.assertVisible(caller, id);
  }

  get(caller: Caller, id: string): Promise<SandboxInfo> {
    return this.deps.lookup.get(caller, id);
  }

  /** get() plus live usage (OOM kills, memory, pids) for a running or paused sandbox. */
  async inspect(caller: Caller, id: string): Promise<SandboxInfo> {
    const s = await this.get(caller, id);
    if (s.status !== 'running' && s.status !== 'paused') return s;
    try {
      return { ...s, usage: await this.deps.lookup.edgeOf(s).sandboxUsage(id) };
    } catch (err) {
      // The row is still the answer; usage is left out, and why is logged rather than hidden.
      if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND'))
        this.deps.log.warn({ sandbox: id, edge: s.edge, err: (err as Error).message }, 'inspect: the edge did not give usage');
      return s;
    }
  }

  /**
   * E2B's envd access token of a sandbox the caller sees (undefined: none, it was not made through
   * the E2B API). Only the E2B layer asks: the token is never among a sandbox's labels.
   */
  async accessToken(caller: Caller, id: string): Promise<string | undefined> {
    // An admin caller (dsec's own, for each envd call) sees every sandbox: no lookup first.
    if (!caller.admin) await this.get(caller, id);
    return this.deps.store.sandboxes.accessToken(id);
  }

  /** The access tokens of the caller's project's sandboxes that have one (an admin key: every project's), by sandbox id. */
  accessTokens(caller: Caller, runningOnly = false): Promise<Map<string, string>> {
    return this.deps.store.sandboxes.accessTokens(caller.admin ? undefined : caller.project, runningOnly);
  }

  /** One page of list() (`limit`, `after`): `next` when there are more. */
  page(caller: Caller, filter: PageFilter): Promise<{ sandboxes: SandboxInfo[]; next?: string }> {
    return this.deps.store.sandboxes.page(scoped(caller, filter));
  }

  /** page() as the JSON text of its SandboxList: what GET /v1/sandboxes sends. */
  pageJson(caller: Caller, filter: PageFilter): Promise<string> {
    return this.deps.store.sandboxes.pageJson(scoped(caller, filter));
  }

  /** The caller's project's sandboxes by status (an admin key: every project's, or the one it names): what the dashboard's overview shows. */
  counts(caller: Caller, project?: string): Promise<Record<string, number>> {
    return this.deps.store.sandboxes.countByStatus(caller.admin ? project : caller.project);
  }

  /** The caller's project's sandboxes (an admin key: every project's, or the one it names). */
  list(caller: Caller, filter: { labels?: Record<string, string>; status?: SandboxStatus; project?: string }): Promise<SandboxInfo[]> {
    return this.deps.store.sandboxes.list(scoped(caller, filter));
  }

  /**
   * Kills a sandbox and removes everything it had. Idempotent: killing a sandbox that is already
   * killed, or gone for any other reason, succeeds, so `finally { await sb.kill() }` never throws
   * for that and two concurrent kills both succeed. Another project's sandbox is, for the caller,
   * one that is gone: the kill succeeds and does nothing.
   */
  async kill(caller: Caller, id: string): Promise<void> {
    const s = await this.deps.store.sandboxes.get(id);
    if (!s || !sees(caller, s.project)) return;
    const teardownFailed = s.status === 'failed' && s.reason?.startsWith(KILL_FAILED_REASON) === true;
    if (s.status === 'running' || s.status === 'creating' || s.status === 'paused' || teardownFailed) {
      try {
        // A sandbox moving now may be on its target by the time the row goes (the move removes
        // the source's copy and keeps the target's once it commits): it is killed on both.
        const to = s.migration?.to;
        if (to !== undefined)
          await Promise.resolve()
            .then(() => this.deps.lookup.edgeOf({ ...s, edge: to }).killSandbox(id))
            .catch(() => undefined); // not made there (yet), or its edge is gone: its reconcile removes it
        await this.deps.lookup.edgeOf(s).killSandbox(id);
        this.deps.metrics.observeKill(s.backend, 'kill');
      } catch (err) {
        if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND'))
          this.deps.metrics.killFailed(s.backend, err instanceof ApiError ? err.code : 'INTERNAL');
        if (err instanceof ApiError && err.code === 'SANDBOX_KILL_FAILED') {
          // Its mounts or cgroups are still on the node: the row stays, saying so, until a kill succeeds.
          await this.deps.store.sandboxes.setStatus(id, 'failed', `${KILL_FAILED_REASON}${err.message}`);
        }
        if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
      }
    }
    await this.deps.ended.retire(s, 'killed');
    const deleted = await this.deps.snapshotImages.release(s);
    for (const image of deleted) await this.deps.projectImages.forget(image as ImageId);
    if (deleted.length) this.deps.log.info({ sandbox: id, images: deleted }, 'deleted unnamed snapshot images nothing uses any more');
  }

  async pause(caller: Caller, id: string): Promise<SandboxInfo> {
    const s = await this.get(caller, id);
    if (s.status === 'paused') return s;
    await (await this.deps.lookup.runningOn(caller, id)).pauseSandbox(id);
    await this.deps.store.sandboxes.setStatus(id, 'paused');
    await this.deps.trajectory.append(id, { kind: 'pause', request: {} });
    return await this.get(caller, id);
  }

  async resume(caller: Caller, id: string): Promise<SandboxInfo> {
    const s = await this.get(caller, id);
    if (s.status === 'running') return s;
    if (s.status !== 'paused')
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}, not paused`, { id, status: s.status });
    await this.deps.lookup.edgeOf(await this.deps.lookup.settled(caller, s)).resumeSandbox(id);
    await this.deps.store.sandboxes.setStatus(id, 'running');
    await this.deps.store.sandboxes.touch(id);
    await this.deps.trajectory.append(id, { kind: 'resume', request: {} });
    return await this.get(caller, id);
  }

  /** Sets when a sandbox expires (E2B's setTimeout); its TTL becomes the span from creation to then. */
  async setExpiry(caller: Caller, id: string, expiresAt: number): Promise<SandboxInfo> {
    const s = await this.get(caller, id);
    const ttl = Math.max(1, Math.ceil((expiresAt - Date.parse(s.createdAt)) / 1000));
    await this.deps.store.sandboxes.setExpiry(id, ttl, Date.parse(s.createdAt) + ttl * 1000);
    return await this.get(caller, id);
  }

  /** Kills every sandbox of the caller's reach carrying all these labels, 32 at a time; returns how many went. */
  async killByLabels(caller: Caller, labels: Record<string, string>): Promise<number> {
    const ids = (await this.list(caller, { labels })).map((s) => s.id);
    let next = 0;
    let killed = 0;
    const worker = async (): Promise<void> => {
      while (next < ids.length) {
        const id = ids[next++]!;
        try {
          await this.kill(caller, id);
          killed++;
        } catch (err) {
          this.deps.log.error({ err, sandbox: id }, 'kill by label failed');
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(32, ids.length) }, worker));
    return killed;
  }

  /** Kills every sandbox the caller reaches (`dsec demo` cleanup and tests, with SYSTEM). */
  async killAll(caller: Caller): Promise<void> {
    await Promise.allSettled((await this.list(caller, {})).map((s) => this.kill(caller, s.id)));
  }
}
