import type { Logger } from 'pino';
import type { CreateSandboxRequest, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { ImageStore } from '../../image/image-store.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import { CreateCoalescer } from '../edges/create-coalescer.js';
import { CreateWrites } from './create-writes.js';
import type { Metrics } from '../metrics.js';
import { infeasible, place, poolUtilisation } from '../placement.js';
import type { CreateLease, StateStore } from '../state-store.js';
import type { ProjectImages } from '../project-images.js';
import type { ProjectQuotas } from '../project-quotas.js';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { Volumes } from './volumes.js';
import { checkPolicy, limitsFor, newSandboxInfo, SandboxSpecs } from './sandbox-spec.js';

export interface SandboxCreationDeps {
  store: Pick<StateStore, 'sandboxes'>;
  /** Resolves a create's volumes to the edge that holds them and the mounts to make. */
  volumes: Volumes;
  images: ImageStore;
  edges: EdgeRegistry;
  log: Logger;
  metrics: Metrics;
  /** Which images a project may start from. */
  projectImages: ProjectImages;
  /** Per-project quotas, checked before a sandbox's row is written. */
  quotas: ProjectQuotas;
  /** Pool that takes burstable sandboxes when their pool is above `burstThreshold` or full. */
  burstPool: string;
  burstThreshold: number;
  /** The lease each create's row is written with (control/create-leases.ts). */
  createLease: () => CreateLease;
  /** Puts the layers where edges read them (the cluster's registry) before an edge is asked. */
  layersReady?: (layers: readonly string[]) => Promise<void>;
}

/** How one create is made: see SandboxCreation.create. */
export interface CreateOptions {
  batch?: { id: string; index: number };
  onPlaced?: (edge: string, sandboxId: string) => void;
  restore?: { edge: string; from: string };
  /** The project the sandbox belongs to (its quotas apply). @default 'default' */
  project?: string;
  /** Wait for the project's create rate instead of a 429. */
  pace?: boolean;
  /** The create-rate token was taken already (a pool claim that missed). */
  rateTaken?: boolean;
  /** E2B's envd access token for the sandbox, kept in the row and never in its labels (store/sandboxes.ts). */
  accessToken?: string;
}

/**
 * How a sandbox comes to exist: its spec resolved (image → layers and config, limits with
 * defaults, network syntax), an edge chosen from the capacity edges report (placement.ts), its
 * row written, and the edge asked, with refusals placed again elsewhere. One sandbox at a time
 * (create) or a batch's group at once (createGroup). `inflight` is what reconcile must leave alone.
 *
 * One file for one concept: the two ways share placement, admission under the project's quota,
 * an edge's refusal placed again, and the kill of creates that got no answer. What is written
 * and how (create-writes.ts, the store) and the spec's checks (sandbox-spec.ts) are apart.
 */
export class SandboxCreation {
  /** Sandboxes whose create is in flight here: reconcile leaves them to their create. */
  readonly inflight = new Set<string>();

  readonly #specs: SandboxSpecs;
  /** Concurrent single creates for one remote edge go as one group request. */
  readonly #creates: CreateCoalescer;
  /**
   * The rows of concurrent creates (of projects without a quota to check) and the running marks of
   * those that succeeded, a turn's worth in one write (create-writes.ts).
   */
  readonly #writes: CreateWrites;

  constructor(private readonly deps: SandboxCreationDeps) {
    this.#specs = new SandboxSpecs(deps);
    this.#creates = new CreateCoalescer(deps.edges);
    this.#writes = new CreateWrites(deps.store, deps.createLease);
  }

  #edge(id: string): EdgeApi {
    return this.deps.edges.api(id);
  }

  /**
   * Placement from the capacity edges last reported: the sandbox's pool (or the burst pool, for a
   * burstable sandbox when its pool is above the burst threshold or has no room), filtered and
   * scored in placement.ts. CAPACITY_EXCEEDED only when no edge of those pools can take it.
   */
  place(req: CreateSandboxRequest, limits: SandboxLimits, layers: string[], exclude: Set<string>, edge?: string): string {
    const candidates = this.deps.edges.candidates();
    // A sandbox that mounts volumes runs on the edge that holds them, whatever its pool.
    const pinned = edge === undefined ? undefined : candidates.find((c) => c.id === edge);
    const pool = pinned?.pool ?? req.placement?.pool ?? 'default';
    const labels = req.placement?.labels;
    const pools = [pool];
    if (req.placement?.burst && pool !== this.deps.burstPool) {
      if (poolUtilisation(candidates, pool) > this.deps.burstThreshold) pools.unshift(this.deps.burstPool);
      else pools.push(this.deps.burstPool);
    }
    for (const p of pools) {
      const chosen = place(candidates, { limits, layers, pool: p, labels, exclude, backend: req.backend, edge });
      if (chosen) return chosen.id;
    }
    const inPool = candidates.filter((c) => pools.includes(c.pool));
    if (inPool.length > 0 && inPool.every((c) => limits.memoryMiB * 1048576 > c.info.capacity.memoryBytes)) {
      const most = Math.max(...inPool.map((c) => Math.floor(c.info.capacity.memoryBytes / 1048576)));
      throw new ApiError('INVALID_REQUEST', `resources.memoryMiB ${limits.memoryMiB} is more than any node has (at most ${most} MiB)`, {
        field: 'resources.memoryMiB',
      });
    }
    const why =
      candidates.length === 0
        ? 'no edge has joined'
        : `no edge of pool ${pools.join(' or ')} can take it (${candidates.map((c) => `${c.id}: ${infeasible(c, { limits, layers, pool: c.pool, labels, exclude, backend: req.backend, edge }) ?? 'other pool'}`).join('; ')})`;
    throw new ApiError('CAPACITY_EXCEEDED', `the cluster is full for this sandbox: ${why}; kill sandboxes or add nodes`, { pools });
  }

  limitsFor(req: CreateSandboxRequest): SandboxLimits {
    return limitsFor(req);
  }

  composeLayers(req: CreateSandboxRequest, project: string): ReturnType<SandboxSpecs['composeLayers']> {
    return this.#specs.composeLayers(req, project);
  }

  /** Everything about a spec that can be checked without placing it: image, layers, network syntax. */
  checkSpec(req: CreateSandboxRequest, project: string = DEFAULT_PROJECT): Promise<void> {
    return this.#specs.checkSpec(req, project);
  }

  /**
   * Creates a sandbox for `opts.project` (default: `default`), within its quotas. `opts.batch`:
   * it is item `index` of a batch (recorded with the row); `opts.onPlaced` hears the edge chosen
   * before the edge answers; `opts.pace`: wait for the project's create rate instead of a 429.
   * `opts.restore`: a VM restored from the latest snapshot of VM `from`, on that VM's edge `edge`
   * (where the snapshot lives), never placed elsewhere.
   */
  async create(req: CreateSandboxRequest, extraLabels: Record<string, string> = {}, opts: CreateOptions = {}): Promise<SandboxInfo> {
    const started = performance.now();
    try {
      const info = await this.#create(req, extraLabels, opts);
      this.deps.metrics.observeCreate(info.backend, info.project ?? DEFAULT_PROJECT, performance.now() - started);
      return info;
    } catch (err) {
      this.deps.metrics.createFailed(req.backend ?? 'container', err instanceof ApiError ? err.code : 'INTERNAL');
      throw err;
    }
  }

  async #create(req: CreateSandboxRequest, extraLabels: Record<string, string>, opts: CreateOptions): Promise<SandboxInfo> {
    const project = opts.project ?? DEFAULT_PROJECT;
    // Answered at once in the common case (read-cache.ts): awaited only when they are promises,
    // since an await of a value is one more promise and a turn of microtasks.
    const composed = this.composeLayers(req, project);
    const { imageId, layers, config } = composed instanceof Promise ? await composed : composed;
    const limits = this.limitsFor(req);
    const network = req.network ? checkPolicy(req.network) : undefined;
    const resolved = this.deps.volumes.resolve(req, project);
    const volumes = resolved instanceof Promise ? await resolved : resolved;
    const exclude = new Set<string>();
    // An edge that refused at admission for a full disk or short memory: what the caller gets when no other edge can take it.
    let refusal: ApiError | undefined;
    // The edge has the last word: one that refuses (full, draining, unreachable before the
    // request left) is excluded and the create placed again, so a caller sees CAPACITY_EXCEEDED
    // only when no edge can take it.
    for (let refreshed = false; ;) {
      let edgeId: string;
      try {
        edgeId = opts.restore?.edge ?? this.place(req, limits, layers, exclude, volumes.edge);
      } catch (err) {
        // An in-process edge's facts are a tick old: ask it now before refusing.
        if (refusal && err instanceof ApiError && err.code === 'CAPACITY_EXCEEDED') throw refusal;
        if (refreshed || !(err instanceof ApiError && err.code === 'CAPACITY_EXCEEDED')) throw err;
        refreshed = true;
        await this.deps.edges.refreshLocal();
        continue;
      }
      const info = newSandboxInfo(req, edgeId, imageId, limits, layers, extraLabels, project);
      this.inflight.add(info.id);
      // Reserved before the row is written: a create placed meanwhile counts this one.
      this.deps.edges.reserve(edgeId, limits);
      try {
        // The project's quota is checked with the row's insert, under the project's lock; a
        // create placed again after an edge refused it has had its rate token already.
        await this.deps.quotas.admit(
          project,
          limits,
          1,
          // Under the project's lock the next create waits for this insert: it goes alone.
          (_, locked) =>
            locked
              ? this.deps.store.sandboxes.insert(info, opts.batch, req, this.deps.createLease(), opts.accessToken)
              : this.#writes.insert({
                  info,
                  spec: req,
                  ...(opts.batch ? { batch: opts.batch } : {}),
                  ...(opts.accessToken ? { accessToken: opts.accessToken } : {}),
                }),
          { rate: exclude.size === 0 && opts.rateTaken !== true, pace: opts.pace === true },
        );
      } catch (err) {
        this.inflight.delete(info.id);
        this.deps.edges.release(edgeId, limits, true);
        throw err;
      }
      opts.onPlaced?.(edgeId, info.id);
      try {
        const ready = this.deps.layersReady?.(layers);
        if (ready) await ready;
        await this.#creates.create(edgeId, {
          id: info.id,
          layers,
          config,
          env: req.env ?? {},
          limits,
          backend: info.backend,
          ...(network ? { network } : {}),
          ...(volumes.mounts.length ? { volumes: volumes.mounts } : {}),
          ...(opts.restore ? { restoreFrom: opts.restore.from } : {}),
        });
      } catch (err) {
        this.inflight.delete(info.id);
        this.deps.edges.release(edgeId, limits, true);
        const refused =
          err instanceof ApiError &&
          (err.code === 'NODE_DISK_FULL' || err.code === 'NODE_MEMORY_PRESSURE') &&
          err.details['admission'] === true;
        if (refused) refusal = err;
        const retry =
          err instanceof ApiError &&
          (refused || err.code === 'CAPACITY_EXCEEDED' || (err.code === 'EDGE_UNAVAILABLE' && err.details['retryable'] === true));
        if (retry && !opts.restore) {
          await this.deps.store.sandboxes.delete(info.id); // never accepted by that edge
          exclude.add(edgeId);
          this.deps.log.info({ edge: edgeId, code: err.code }, 'edge refused a create; placing it again');
          continue;
        }
        const reason = err instanceof Error ? err.message : String(err);
        await this.deps.store.sandboxes.settleCreate(info.id, 'failed', reason);
        if (outcomeUnknown(err)) this.#killUnanswered(edgeId, [info.id]);
        if (err instanceof ApiError) {
          err.details['sandboxId'] = info.id;
          throw err;
        }
        throw new ApiError('SANDBOX_CREATE_FAILED', reason, { sandboxId: info.id });
      }
      this.deps.edges.release(edgeId, limits, false);
      this.inflight.delete(info.id);
      const settled = (await this.#writes.running(info.id)) ?? undefined;
      // The edge was declared lost while this create was in flight: the caller gets an error, so
      // the row becomes failed (a lost row would be revived if the edge came back, owned by nobody).
      if (settled === 'lost') {
        await this.deps.store.sandboxes.setStatusIf(info.id, 'lost', 'failed', `edge ${edgeId} was lost while it was being created`);
        throw new ApiError('EDGE_UNAVAILABLE', `edge ${edgeId} was lost while sandbox ${info.id} was being created`, {
          sandboxId: info.id,
          edge: edgeId,
        });
      }
      if (settled !== 'running') {
        // This replica lost the store for longer than its create lease, and another replica took
        // the create over and settled it (create-leases.ts): its word stands.
        const row = await this.deps.store.sandboxes.get(info.id);
        throw new ApiError(
          'SANDBOX_CREATE_FAILED',
          `sandbox ${info.id} was settled by another control-plane replica while this one created it: ${row?.reason ?? settled ?? 'gone'}`,
          { sandboxId: info.id },
        );
      }
      return { ...info, status: 'running' };
    }
  }

  /**
   * Sandboxes whose create call got no answer (sent, then the connection broke or the edge was
   * lost): each may exist on the edge, or still be in the making there, while its row says failed.
   * Each is killed there in the background (the edge's kill waits for a create it is still busy
   * with), again with backoff while the edge does not answer, for up to KILL_UNANSWERED_MS; and
   * the edge is reconciled at its next report to this replica, the backstop if all tries fail.
   */
  #killUnanswered(edgeId: string, ids: readonly string[]): void {
    this.deps.edges.reconcileAtNextReport(edgeId);
    const until = Date.now() + KILL_UNANSWERED_MS;
    const killOne = async (id: string): Promise<void> => {
      for (let delay = 500; ; delay = Math.min(delay * 2, 15_000)) {
        try {
          await this.deps.edges.apiEvenIfLost(edgeId).killSandbox(id);
          this.deps.log.warn({ edge: edgeId, sandbox: id }, 'killed a sandbox whose create got no answer (it had been made on the edge)');
          return;
        } catch (err) {
          if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND') return; // never made there
          if (!this.deps.edges.has(edgeId) || Date.now() + delay > until) {
            this.deps.log.error(
              { edge: edgeId, sandbox: id, err: (err as Error).message },
              'could not kill a sandbox whose create got no answer; the edge is reconciled at its next report',
            );
            return;
          }
        }
        await new Promise((r) => setTimeout(r, delay).unref());
      }
    };
    for (const id of ids) void killOne(id);
  }

  /**
   * Creates sandboxes of one spec as a group (a batch's): placement for each from the reported
   * capacity, every row in one transaction, one call per edge (EdgeApi.createSandboxes) instead of
   * one per sandbox, and the outcomes in one more transaction. An item an edge refuses is placed
   * again elsewhere, as in create(); each item ends running (`onRunning`) or failed with a reason
   * (`onFailed`).
   */
  async createGroup(
    req: CreateSandboxRequest,
    extraLabels: Record<string, string>,
    indexes: number[],
    hooks: {
      batchId: string;
      project: string;
      onPlaced: (index: number, edge: string, sandboxId: string) => void;
      onRunning: (index: number, edge: string, sandboxId: string) => void;
      onFailed: (index: number, code: string, reason: string, sandboxId?: string) => void;
    },
  ): Promise<void> {
    const backend = req.backend ?? 'container';
    const onFailed = hooks.onFailed;
    hooks = {
      ...hooks,
      onFailed: (index, code, reason, sandboxId) => {
        this.deps.metrics.createFailed(backend, code);
        onFailed(index, code, reason, sandboxId);
      },
    };
    const { imageId, layers, config } = await this.composeLayers(req, hooks.project);
    const limits = this.limitsFor(req);
    const network = req.network ? checkPolicy(req.network) : undefined;
    const volumes = await this.deps.volumes.resolve(req, hooks.project);
    const started = performance.now();
    let pending = indexes.map((index) => ({ index, exclude: new Set<string>() }));
    let refreshed = false;
    while (pending.length) {
      const next: typeof pending = [];
      const placed: { item: (typeof pending)[number]; info: SandboxInfo }[] = [];
      let full = false;
      for (const item of pending) {
        let edgeId: string;
        try {
          edgeId = this.place(req, limits, layers, item.exclude, volumes.edge);
        } catch (err) {
          const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
          // An in-process edge's facts are a tick old: ask it now before refusing (once).
          if (e.code === 'CAPACITY_EXCEEDED' && !refreshed) {
            full = true;
            next.push(item);
          } else hooks.onFailed(item.index, e.code, e.message);
          continue;
        }
        const info = newSandboxInfo(req, edgeId, imageId, limits, layers, extraLabels, hooks.project);
        this.deps.edges.reserve(edgeId, limits);
        this.inflight.add(info.id);
        placed.push({ item, info });
      }
      // The project's quotas: as many as fit are admitted (the create rate paces the batch); the
      // rest fail with the quota's code. Items placed again after a refusal have their tokens.
      const fresh = placed.filter((p) => p.item.exclude.size === 0).length;
      let refused: ApiError | undefined;
      const admitted =
        placed.length === 0
          ? 0
          : await Promise.resolve(
              this.deps.quotas.admit(
                hooks.project,
                limits,
                placed.length,
                async (n) => {
                  await this.deps.store.sandboxes.insertMany(
                    placed.slice(0, n).map((p) => ({
                      info: p.info,
                      batch: { id: hooks.batchId, index: p.item.index },
                      spec: req,
                      // the batch's row has it (hooks.batchId is a batch of the store's)
                      specOnBatch: true,
                    })),
                    this.deps.createLease(),
                  );
                  return n;
                },
                { fit: true, pace: true, rate: fresh > 0, onShort: (err) => (refused = err) },
              ),
            ).catch((err: unknown) => {
              if (!(err instanceof ApiError)) throw err;
              refused = err;
              return 0;
            });
      for (const p of placed.splice(admitted)) {
        this.inflight.delete(p.info.id);
        this.deps.edges.release(p.info.edge, limits, true);
        const e = refused ?? new ApiError('QUOTA_SANDBOXES_EXCEEDED', `project ${hooks.project}'s quota is full`);
        hooks.onFailed(p.item.index, e.code, e.message);
      }
      for (const p of placed) hooks.onPlaced(p.item.index, p.info.edge, p.info.id);
      if (placed.length) await this.deps.layersReady?.(layers);
      const byEdge = new Map<string, typeof placed>();
      for (const p of placed) {
        const group = byEdge.get(p.info.edge);
        if (group) group.push(p);
        else byEdge.set(p.info.edge, [p]);
      }
      const done: { id: string; status: SandboxStatus; reason?: string }[] = [];
      /** Groups whose call ended with no answer: killed on their edge once their rows say failed. */
      const unanswered: { edgeId: string; ids: string[] }[] = [];
      const running: typeof placed = [];
      const failed: { p: (typeof placed)[number]; code: string; reason: string }[] = [];
      await Promise.all(
        [...byEdge].map(async ([edgeId, group]) => {
          let outcomes: { id: string; sandbox?: unknown; error?: { code: string; message: string; details: Record<string, unknown> } }[];
          try {
            outcomes = await this.#edge(edgeId).createSandboxes(
              group.map((p) => ({
                id: p.info.id,
                layers,
                config,
                env: req.env ?? {},
                limits,
                backend,
                ...(network ? { network } : {}),
                ...(volumes.mounts.length ? { volumes: volumes.mounts } : {}),
              })),
            );
          } catch (err) {
            if (outcomeUnknown(err)) unanswered.push({ edgeId, ids: group.map((p) => p.info.id) });
            const e = err instanceof ApiError ? err : new ApiError('SANDBOX_CREATE_FAILED', (err as Error).message);
            outcomes = group.map((p) => ({ id: p.info.id, error: { code: e.code, message: e.message, details: e.details } }));
          }
          for (const [i, p] of group.entries()) {
            const o = outcomes[i];
            this.inflight.delete(p.info.id);
            if (o?.sandbox) {
              this.deps.edges.release(edgeId, limits, false);
              running.push(p);
              continue;
            }
            this.deps.edges.release(edgeId, limits, true);
            const error = o?.error ?? {
              code: 'SANDBOX_CREATE_FAILED',
              message: `edge ${edgeId} gave no answer for ${p.info.id}`,
              details: {},
            };
            if (error.code === 'CAPACITY_EXCEEDED' || (error.code === 'EDGE_UNAVAILABLE' && error.details['retryable'] === true)) {
              await this.deps.store.sandboxes.delete(p.info.id); // never accepted by that edge
              p.item.exclude.add(edgeId);
              next.push(p.item);
              continue;
            }
            failed.push({ p, code: error.code, reason: error.message });
          }
        }),
      );
      for (const p of running) done.push({ id: p.info.id, status: 'running' });
      for (const f of failed) done.push({ id: f.p.info.id, status: 'failed', reason: f.reason });
      const settledElsewhere = await this.deps.store.sandboxes.setStatuses(done);
      for (const u of unanswered) this.#killUnanswered(u.edgeId, u.ids);
      let ran = 0;
      for (const p of running) {
        const other = settledElsewhere.get(p.info.id);
        // The edge was declared lost while this create was in flight: the row says lost.
        if (other?.status === 'lost') {
          // Reported failed to the batch: its row must not be revived if the edge comes back.
          await this.deps.store.sandboxes.setStatusIf(
            p.info.id,
            'lost',
            'failed',
            `edge ${p.info.edge} was lost while it was being created`,
          );
          hooks.onFailed(p.item.index, 'EDGE_UNAVAILABLE', `edge ${p.info.edge} was lost while the sandbox was being created`, p.info.id);
        }
        // Another replica took the create over (this one lost the store past its lease) and failed it.
        else if (other)
          hooks.onFailed(p.item.index, 'SANDBOX_CREATE_FAILED', other.reason ?? `settled as ${other.status} by another replica`, p.info.id);
        else {
          ran++;
          hooks.onRunning(p.item.index, p.info.edge, p.info.id);
        }
      }
      this.deps.metrics.observeCreates(backend, hooks.project, performance.now() - started, ran);
      for (const f of failed) hooks.onFailed(f.p.item.index, f.code, f.reason, f.p.info.id);
      if (full) {
        refreshed = true;
        await this.deps.edges.refreshLocal();
      }
      pending = next;
    }
  }
}

/** How long a create that got no answer keeps trying to kill its sandbox on the edge. */
const KILL_UNANSWERED_MS = 5 * 60_000;

/**
 * Whether a failed call to an edge may have done its work there anyway: the request was sent and
 * no answer came (EDGE_UNAVAILABLE that is not `retryable`, i.e. not refused before it left), or
 * it failed in a way that is not the edge's answer.
 */
function outcomeUnknown(err: unknown): boolean {
  if (!(err instanceof ApiError)) return true;
  return err.code === 'EDGE_UNAVAILABLE' && err.details['retryable'] !== true;
}
