import type { Logger } from 'pino';
import { Readable, type Duplex } from 'node:stream';
import type {
  CreateSandboxRequest,
  ExecRequest,
  NodeInfo,
  ExecResult,
  ForkRequest,
  ForkResult,
  OpenSessionRequest,
  ReplayResult,
  SandboxInfo,
  SnapshotRequest,
  SnapshotResult,
  SandboxStatus,
  SessionExecRequest,
  SessionInfo,
  NetworkPolicyRequest,
  NetworkPolicyResult,
  NetworkPolicyState,
  StartProcessRequest,
  ProcessInfo,
} from '@dsec/sdk/schema';
import type { Link } from '../net/address-pool.js';
import type { NetworkPolicy } from '../net/policy.js';
import { MAX_STDIN_BYTES } from '@dsec/sdk/schema';
import type { ExecEvent } from '../edge/protocol/exec-event.js';
import { ApiError } from '../api-error.js';
import type { EdgeApi, SandboxLimits } from '../edge/protocol/edge-api.js';
import { EdgeRegistry } from './edges/edge-registry.js';
import { BatchService } from './batches.js';
import { checkPolicy, SandboxCreation } from './sandbox-creation.js';
import { CreateLeases } from './create-leases.js';
import type { ClusterRegistry } from './cluster/cluster-registry.js';
import type { ImageId, ImageStore } from '../image/image-store.js';
import { Volumes } from './volumes.js';
import type { LayerDigest } from '../image/layer-store.js';
import { CACHE_KEY_LABEL } from '../image/builders/builder.js';
import type { StateStore } from './state-store.js';
import { Metrics } from './metrics.js';
import { replayEntries } from './replay.js';
import { SnapshotImages } from './snapshot-images.js';
import { DEFAULT_TRAJECTORY_RETENTION_HOURS, EndedSandboxes } from './ended-sandboxes.js';
import { OwnedSandboxes } from './owned-sandboxes.js';
import { MAX_LOGGED_OUTPUT, MAX_PAYLOAD, TrajectoryLog } from './trajectory-log.js';
import { WarmPools } from './warm-pools.js';
import { FnService } from './fn-service.js';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { Caller } from './api-keys.js';
import { ProjectImages, SHARED_IMAGES_ONLY } from './project-images.js';
import { ProjectQuotas } from './project-quotas.js';
import { isDiskFull } from '../host/disk-space.js';

export { DEFAULT_LIMITS, edgeOf, newSandboxId } from './sandbox-ids.js';

/**
 * The control plane's logic, apart from HTTP: validates against images and limits, places
 * sandboxes on edges, keeps the state store in step with the edges. It reaches edges only
 * through EdgeApi and never touches an edge's files.
 */
export interface ControlPlaneOptions {
  /** The edges; a registry with no edges (and no cluster token) when omitted. */
  edges?: EdgeRegistry;
  /** Pool that takes burstable sandboxes when their pool is above `burstThreshold` or full. */
  burstPool?: string;
  /** Utilisation (0..1) of a pool above which burstable sandboxes go to the burst pool. */
  burstThreshold?: number;
  /** How long a killed sandbox's trajectory stays readable; 0 deletes it with the sandbox. @default 24 */
  trajectoryRetentionHours?: number;
  /** The cluster's OCI registry: layers are put there for edges, and joining edges are told of it. */
  registry?: ClusterRegistry;
  /**
   * This replica's name, when several control planes share one store: background work (expiry,
   * the edge watcher, batch drivers) runs on the one holding its lease. @default 'only'
   */
  replicaId?: string;
}

/** How long the expiry sweep's lease lasts without renewal (it renews at every sweep). */
const EXPIRY_LEASE_MS = 5_000;

/** Above 80 % of a pool's slots or memory, burstable sandboxes go to the burst pool. */
export const DEFAULT_BURST_THRESHOLD = 0.8;

/** The reason of a sandbox whose kill left resources on its node; a kill retries it. */
const KILL_FAILED_REASON = 'kill failed, resources remain: ';

export class ControlPlane {
  readonly edges: EdgeRegistry;
  readonly replicaId: string;
  /** Named volumes (control/volumes.ts). */
  readonly volumes: Volumes;
  readonly trajectory: TrajectoryLog;
  /** Batches of up to 32,000 sandboxes, driven through create(). */
  readonly batches: BatchService;
  /** Unnamed snapshots go away with their sandbox (and the sandboxes started from them). */
  readonly snapshotImages: SnapshotImages;
  /** Killed sandboxes whose trajectory is still kept. */
  readonly ended: EndedSandboxes;
  /** Sandboxes owned by a process (a build's steps), killed once it is gone. */
  readonly owned: OwnedSandboxes;
  /** Counted here, not in routes, so forks, replays and every exec path count too. */
  readonly metrics = new Metrics();
  /** Resolving, placing and creating sandboxes (placement.ts decides where). */
  readonly #creation: SandboxCreation;
  /** Leases on creates in flight; a dead replica's are taken over (create-leases.ts). */
  readonly createLeases: CreateLeases;
  /** The cluster's OCI registry, when it has one (edges read layers from it). */
  readonly registry: ClusterRegistry | undefined;
  /** Warm pools: ready sandboxes a create claims instead of waiting for one (started by the runtime). */
  readonly pools: WarmPools;
  /** Function calls, run by the edges' FnCall backends. */
  readonly fn: FnService;
  /** Per-project quotas, enforced when sandboxes are admitted. */
  readonly quotas: ProjectQuotas;
  /** Which images each project may use. */
  readonly projectImages: ProjectImages;

  constructor(
    private readonly store: StateStore,
    private readonly images: ImageStore,
    private readonly log: Logger,
    opts: ControlPlaneOptions = {},
  ) {
    this.trajectory = new TrajectoryLog(store);
    this.replicaId = opts.replicaId ?? 'only';
    this.batches = new BatchService(store, this, log.child({ component: 'batches' }), this.replicaId);
    this.snapshotImages = new SnapshotImages(store, images);
    this.ended = new EndedSandboxes(store, (opts.trajectoryRetentionHours ?? DEFAULT_TRAJECTORY_RETENTION_HOURS) * 3600_000);
    this.owned = new OwnedSandboxes({
      list: (labels) => this.list({ labels }),
      kill: (id) => this.kill(id),
      log: log.child({ component: 'owned-sandboxes' }),
    });
    this.edges = opts.edges ?? new EdgeRegistry({ store, token: '', log });
    this.quotas = new ProjectQuotas(store);
    this.projectImages = new ProjectImages(store, images);
    this.volumes = new Volumes({ store, edges: this.edges, log: log.child({ component: 'volumes' }) });
    this.registry = opts.registry;
    const registry = opts.registry;
    this.createLeases = new CreateLeases(store, this.edges, log.child({ component: 'create-leases' }), this.replicaId);
    this.#creation = new SandboxCreation({
      createLease: () => this.createLeases.lease(),
      ...(registry ? { layersReady: (layers: readonly string[]) => registry.ensure(layers) } : {}),
      quotas: this.quotas,
      projectImages: this.projectImages,
      store,
      volumes: this.volumes,
      images,
      edges: this.edges,
      log,
      metrics: this.metrics,
      burstPool: opts.burstPool ?? 'burst',
      burstThreshold: opts.burstThreshold ?? DEFAULT_BURST_THRESHOLD,
    });
    this.metrics.watchCluster({
      edges: async () => {
        await this.edges.refreshLocal();
        return this.edges.describe();
      },
      sandboxes: async () => this.store.listSandboxes(),
      batches: () => this.batches.progress(),
    });
    this.pools = new WarmPools(
      store,
      {
        create: (req, labels) => this.#creation.create(req, labels),
        checkSpec: (req) => this.#creation.checkSpec(req),
        kill: (id) => this.kill(id),
      },
      log.child({ component: 'pools' }),
    );
    this.fn = new FnService({
      edges: this.edges,
      compose: (req, project) => this.#creation.composeLayers(req, project ?? SHARED_IMAGES_ONLY),
      log: log.child({ component: 'fn' }),
    });
    this.edges.onLost = async (edge, why) => {
      const lost = await this.store.markEdgeLost(edge, `lost: ${why}`);
      if (lost.length) this.log.error({ edge, sandboxes: lost.length }, 'sandboxes of a lost edge marked lost');
    };
    this.edges.onBack = async (edge) => {
      await this.reconcile(edge);
    };
  }

  /**
   * Brings the store in line with what an edge actually runs (after either restarted, or when a
   * lost edge reports again). The rule: a sandbox the edge runs and the store has as running or
   * paused is kept; one the store already reported `lost` is killed (its caller was told it is
   * gone, and may have replayed it elsewhere); one the store does not know is killed (no caller
   * was ever told about it). A sandbox the store has as live but the edge does not run becomes
   * `failed` with the reason.
   */
  async reconcile(edgeId: string): Promise<{ lost: string[]; orphans: string[]; killedLost: string[] }> {
    const edge = this.edges.apiEvenIfLost(edgeId);
    // A create that is in flight now may finish on the edge after it lists its sandboxes, or
    // before the store is read below: either way, that sandbox is its create's to settle.
    // On a shared store, creates another replica has in flight count too (their leases are live).
    const inflight = new Set([...this.#creation.inflight, ...(await this.store.leasedCreates(edgeId, Date.now()))]);
    const onEdge = new Set((await edge.listSandboxes()).map((s) => s.id));
    const rows = await this.store.listSandboxes({ edge: edgeId });
    // A create placed after the snapshot above may have finished on the edge after its list and
    // settled before the rows were read: its row says running and the list lacks it, yet it runs.
    // The edge is asked again, after that read, before any such row is failed.
    const missing = rows.filter(
      (s) => (s.status === 'running' || s.status === 'creating' || s.status === 'paused') && !onEdge.has(s.id) && !inflight.has(s.id),
    );
    const runsNow = missing.length ? new Set((await edge.listSandboxes()).map((s) => s.id)) : new Set<string>();
    const lost: string[] = [];
    const killedLost: string[] = [];
    for (const s of rows) {
      if (inflight.has(s.id) || this.#creation.inflight.has(s.id) || runsNow.has(s.id)) {
        onEdge.delete(s.id);
        continue;
      }
      if ((s.status === 'running' || s.status === 'creating' || s.status === 'paused') && !onEdge.has(s.id)) {
        await this.store.setStatus(s.id, 'failed', 'lost: the edge no longer has this sandbox (it was removed while dsec was down)');
        lost.push(s.id);
      }
      if (s.status === 'creating' && onEdge.has(s.id)) await this.store.setStatus(s.id, 'running');
      const live = s.status === 'running' || s.status === 'creating' || s.status === 'paused';
      if (!live && onEdge.has(s.id)) {
        // Reported lost, failed or stopped: the caller was told it is not running, so it must not run.
        await edge
          .killSandbox(s.id)
          .catch((err: unknown) => this.log.error({ err, sandbox: s.id }, `killing a ${s.status} sandbox failed`));
        if (s.status === 'lost') await this.store.setStatus(s.id, 'lost', `${s.reason ?? 'lost'}; killed when edge ${edgeId} came back`);
        killedLost.push(s.id);
      }
      onEdge.delete(s.id);
    }
    // Sandboxes no caller was ever told about: kill them rather than leak them.
    const orphans = [...onEdge];
    for (const id of orphans)
      await edge.killSandbox(id).catch((err: unknown) => this.log.error({ err, sandbox: id }, 'killing an orphan failed'));
    if (lost.length || orphans.length || killedLost.length)
      this.log.warn({ edge: edgeId, lost, orphans, killedLost }, 'reconciled state store with edge');
    return { lost, orphans, killedLost };
  }

  #edge(id: string): EdgeApi {
    return this.edges.api(id);
  }

  limitsFor(req: CreateSandboxRequest): SandboxLimits {
    return this.#creation.limitsFor(req);
  }

  /** Everything about a spec that can be checked without placing it: image, layers, network syntax. */
  async checkSpec(req: CreateSandboxRequest, project: string = DEFAULT_PROJECT): Promise<void> {
    await this.#creation.checkSpec(req, project);
  }

  /**
   * Throws SANDBOX_NOT_FOUND, worded as for a sandbox that does not exist, when `id` belongs to
   * another project than the caller's (an admin key sees every project). Ids of other projects
   * neither answer 403 nor show up anywhere, so they do not leak (docs/PROJECTS.md). An id no
   * project has passes: the route's own lookup answers for it.
   */
  async assertVisible(caller: Caller, id: string): Promise<void> {
    if (caller.admin) return;
    const project = (await this.store.sandboxProject(id)) ?? (await this.ended.projectOf(id));
    if (project !== undefined && project !== caller.project) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { id });
  }

  /**
   * Creates one sandbox (SandboxCreation.create), or claims a ready one from the warm pool the
   * request names or matches (a batch's items are always created).
   */
  async create(...[req, extraLabels = {}, opts = {}]: Parameters<SandboxCreation['create']>): ReturnType<SandboxCreation['create']> {
    if (!opts.batch && this.pools.poolFor(req) !== undefined) {
      // A claim is a create for the project's quotas: it moves a ready sandbox into the project.
      const project = opts.project ?? DEFAULT_PROJECT;
      const claimed = await this.quotas.admit(project, this.limitsFor(req), 1, () => this.pools.claim(req, project), {
        pace: opts.pace === true,
      });
      if (claimed) return claimed;
      opts = { ...opts, rateTaken: true };
    }
    const { pool: _pool, ...spec } = req;
    return this.#creation.create(spec, { ...extraLabels, ...WarmPools.missLabels(req) }, opts);
  }

  /** Creates a batch's group of sandboxes: see SandboxCreation.createGroup. */
  createGroup(...args: Parameters<SandboxCreation['createGroup']>): ReturnType<SandboxCreation['createGroup']> {
    return this.#creation.createGroup(...args);
  }

  async get(id: string): Promise<SandboxInfo> {
    const s = await this.store.getSandbox(id);
    if (!s) {
      const ended = await this.ended.get(id);
      if (ended) {
        throw new ApiError(
          'SANDBOX_NOT_FOUND',
          `sandbox ${id} was killed at ${ended.endedAt}; its trajectory stays readable until ${ended.keptUntil} (GET /v1/sandboxes/${id}/trajectory, dsec log ${id})`,
          {
            id,
            ...ended,
          },
        );
      }
      throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { id });
    }
    return s;
  }

  /** Throws SANDBOX_NOT_FOUND unless `id` is a sandbox, or a killed one whose trajectory is still kept. */
  async assertTrajectoryKept(id: string): Promise<void> {
    if (!(await this.store.getSandbox(id)) && !(await this.ended.get(id))) await this.get(id);
  }

  /** get() plus live usage (OOM kills, memory, pids) for a running or paused sandbox. */
  async inspect(id: string): Promise<SandboxInfo> {
    const s = await this.get(id);
    if (s.status !== 'running' && s.status !== 'paused') return s;
    try {
      return { ...s, usage: await this.#edge(s.edge).sandboxUsage(id) };
    } catch (err) {
      // The row is still the answer; usage is left out, and why is logged rather than hidden.
      if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND'))
        this.log.warn({ sandbox: id, edge: s.edge, err: (err as Error).message }, 'inspect: the edge did not give usage');
      return s;
    }
  }

  list(filter: { labels?: Record<string, string>; status?: SandboxStatus; project?: string }): Promise<SandboxInfo[]> {
    return this.store.listSandboxes(filter);
  }

  /**
   * Kills a sandbox and removes everything it had. Idempotent: killing a sandbox that is already
   * killed, or gone for any other reason, succeeds, so `finally { await sb.kill() }` never throws
   * for that and two concurrent kills both succeed.
   */
  async kill(id: string): Promise<void> {
    const s = await this.store.getSandbox(id);
    if (!s) return;
    const teardownFailed = s.status === 'failed' && s.reason?.startsWith(KILL_FAILED_REASON) === true;
    if (s.status === 'running' || s.status === 'creating' || s.status === 'paused' || teardownFailed) {
      try {
        await this.#edge(s.edge).killSandbox(id);
        this.metrics.observeKill(s.backend, 'kill');
      } catch (err) {
        if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND'))
          this.metrics.killFailed(s.backend, err instanceof ApiError ? err.code : 'INTERNAL');
        if (err instanceof ApiError && err.code === 'SANDBOX_KILL_FAILED') {
          // Its mounts or cgroups are still on the node: the row stays, saying so, until a kill succeeds.
          await this.store.setStatus(id, 'failed', `${KILL_FAILED_REASON}${err.message}`);
        }
        if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
      }
    }
    await this.ended.retire(s, 'killed');
    const deleted = await this.snapshotImages.release(s);
    for (const image of deleted) await this.projectImages.forget(image as ImageId);
    if (deleted.length) this.log.info({ sandbox: id, images: deleted }, 'deleted unnamed snapshot images nothing uses any more');
  }

  /** The edge of a running sandbox; counts as activity for the idle timeout. */
  async #runningOn(id: string): Promise<EdgeApi> {
    const s = await this.get(id);
    if (s.status !== 'running') {
      const hint = s.status === 'paused' ? ': resume it first (POST /v1/sandboxes/{id}/resume)' : s.reason ? `: ${s.reason}` : '';
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}${hint}`, { id, status: s.status });
    }
    const pool = this.pools.unclaimedIn(id);
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
    await this.store.touch(id).catch((err: unknown) => {
      if (!isDiskFull(err)) throw err;
      this.log.warn({ sandbox: id, err }, 'the disk is full: the activity stamp was not written');
    });
    return this.#edge(s.edge);
  }

  // --- pause, resume, snapshot, fork -----------------------------------------------------------

  async pause(id: string): Promise<SandboxInfo> {
    const s = await this.get(id);
    if (s.status === 'paused') return s;
    await (await this.#runningOn(id)).pauseSandbox(id);
    await this.store.setStatus(id, 'paused');
    await this.trajectory.append(id, { kind: 'pause', request: {} });
    return await this.get(id);
  }

  async resume(id: string): Promise<SandboxInfo> {
    const s = await this.get(id);
    if (s.status === 'running') return s;
    if (s.status !== 'paused')
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}, not paused`, { id, status: s.status });
    await this.#edge(s.edge).resumeSandbox(id);
    await this.store.setStatus(id, 'running');
    await this.store.touch(id);
    await this.trajectory.append(id, { kind: 'resume', request: {} });
    return await this.get(id);
  }

  /**
   * pack_diff → an image (parent layers + the delta) that new sandboxes start from.
   * `opts.privateTo`: the image (and its name) become that project's own; without it (an admin
   * key's snapshot, an image build's step) the image is shared. `opts.signal`: the caller has
   * gone; the edge stops the copy and mkfs.erofs and keeps nothing.
   */
  /**
   * Writes a terminal's trajectory step once it exits. Nobody awaits it (the terminal's socket may
   * be long gone), so a store that fails then (PostgreSQL restarting) is logged here, not left an
   * unhandled rejection.
   */
  logTerminalExit(id: string, exit: Promise<number>, request: Record<string, unknown>, started: number): void {
    exit
      .then((exitCode) =>
        this.trajectory.append(id, { kind: 'pty', request, exitCode, durationMs: performance.now() - started, replayable: false }),
      )
      .catch((err: unknown) => this.log.error({ err, sandbox: id }, 'logging a terminal step failed'));
  }

  async snapshot(id: string, req: SnapshotRequest = {}, opts: { privateTo?: string; signal?: AbortSignal } = {}): Promise<SnapshotResult> {
    const signal = opts.signal;
    const s = await this.get(id);
    const nameOwner =
      req.name && opts.privateTo !== undefined ? await this.projectImages.checkName(opts.privateTo, req.name, false) : undefined;
    if (s.status !== 'running' && s.status !== 'paused') {
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}: only running or paused sandboxes can be snapshotted`, {
        id,
      });
    }
    const snap = await this.#edge(s.edge).snapshotSandbox(id, {
      ...(req.scrub ? { scrub: req.scrub } : {}),
      ...(signal ? { signal } : {}),
    });
    const layers = (snap.layer ? [...snap.baseLayers, snap.layer] : snap.baseLayers) as LayerDigest[];
    // A snapshot is not a builder's output: it must not carry the builder's cache key.
    const { [CACHE_KEY_LABEL]: _key, ...labels } = snap.config.labels;
    const manifest = { layers, config: { ...snap.config, labels } };
    // An image that existed already (an unchanged sandbox's) keeps the lifetime it had.
    const existed = this.images.get(this.images.idOf(manifest)) !== undefined;
    const kept = Boolean(req.name) || req.keep === true || existed;
    // The edge gave the new layer to the replica it reads blobs from, which may be another one: with
    // the cluster's registry as the blob store that one put it there, and it is fetched from there.
    if (snap.layer) await this.images.layers.fetch(snap.layer as LayerDigest);
    const imageId = this.images.put(manifest);
    if (opts.privateTo !== undefined) await this.projectImages.claim(opts.privateTo, imageId, existed);
    if (req.name) {
      this.images.tag(req.name, imageId);
      await this.projectImages.recordName(req.name, nameOwner);
    }
    if (!kept) await this.snapshotImages.own(imageId, id);
    return { imageId, layers, layerAdded: snap.layer !== null, frozenMs: Math.round(snap.frozenMs * 100) / 100, ...snap.stats, kept };
  }

  /**
   * One snapshot, then `count` sandboxes from it, created concurrently in the parent's project
   * (within its quotas: refused before the snapshot when the count cannot fit; paced to its
   * create rate). `opts.privateTo` as for snapshot.
   */
  async fork(id: string, req: ForkRequest, opts: { privateTo?: string } = {}): Promise<ForkResult> {
    const parent = await this.get(id);
    const project = parent.project ?? DEFAULT_PROJECT;
    const spec = (await this.store.getSpec<CreateSandboxRequest>(id)) ?? { image: parent.imageId };
    await this.quotas.precheck(project, this.limitsFor(spec), req.count, true);
    if (parent.backend !== undefined && parent.backend !== 'container') return this.#forkVm(parent, req, project);
    const snapshot = await this.snapshot(id, {}, opts);
    // Forks start with the policy in force now, not the one the parent was created with: a
    // parent switched to none for its rollout phase must not hand its forks the setup phase's.
    const network = await this.#currentPolicy(id);
    const results = await Promise.allSettled(
      Array.from({ length: req.count }, () =>
        this.create(
          {
            ...spec,
            image: snapshot.imageId,
            layers: [],
            labels: { ...(spec.labels ?? {}), ...(req.labels ?? {}) },
            ...(network ? { network } : {}),
          },
          { 'dsec.fork-of': id },
          { project, pace: true },
        ),
      ),
    );
    const sandboxes: SandboxInfo[] = [];
    const failures: ForkResult['failures'] = [];
    for (const r of results) {
      if (r.status === 'fulfilled') sandboxes.push(r.value);
      else failures.push({ code: r.reason instanceof ApiError ? r.reason.code : 'INTERNAL', message: (r.reason as Error).message });
    }
    return { snapshot, sandboxes, failures };
  }

  /**
   * A live fork of a VM: its edge saves the VM's memory, devices and disk (the VM runs on), then
   * `count` VMs are restored from that state on the same edge (where it lives), each with its own
   * copy of the disk: processes, their memory and the guest's files continue in every fork.
   * `snapshot.imageId` is the parent's image (the state itself is not an image).
   */
  async #forkVm(parent: SandboxInfo, req: ForkRequest, project: string): Promise<ForkResult> {
    const id = parent.id;
    if (parent.status !== 'running' && parent.status !== 'paused') {
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${parent.status}: only running or paused VMs can be forked`, { id });
    }
    const snap = await this.#edge(parent.edge).snapshotSandbox(id, { memory: true });
    const spec = (await this.store.getSpec<CreateSandboxRequest>(id)) ?? { image: parent.imageId, backend: parent.backend };
    const network = await this.#currentPolicy(id);
    const results = await Promise.allSettled(
      Array.from({ length: req.count }, () =>
        this.create(
          { ...spec, image: parent.imageId, labels: { ...(spec.labels ?? {}), ...(req.labels ?? {}) }, ...(network ? { network } : {}) },
          { 'dsec.fork-of': id },
          { restore: { edge: parent.edge, from: id }, project, pace: true },
        ),
      ),
    );
    const sandboxes: SandboxInfo[] = [];
    const failures: ForkResult['failures'] = [];
    for (const r of results) {
      if (r.status === 'fulfilled') sandboxes.push(r.value);
      else failures.push({ code: r.reason instanceof ApiError ? r.reason.code : 'INTERNAL', message: (r.reason as Error).message });
    }
    const snapshot = {
      imageId: parent.imageId,
      layers: snap.baseLayers,
      layerAdded: false,
      frozenMs: Math.round(snap.frozenMs * 100) / 100,
      ...snap.stats,
      kept: true,
    };
    return { snapshot, sandboxes, failures };
  }

  // --- network -------------------------------------------------------------------------------

  /** The egress policy a sandbox has now, as a request (resolved addresses, not the names given). */
  async #currentPolicy(id: string): Promise<NetworkPolicyRequest | undefined> {
    const s = await this.get(id);
    if (s.status !== 'running' && s.status !== 'paused') return undefined;
    const r = await this.#edge(s.edge).getNetwork(id);
    const allow = r.policy.allow.map((a) => (a.port === undefined ? a.cidr : `${a.cidr}:${a.port}`));
    return r.policy.mode === 'allow' ? { mode: 'allow', allow } : { mode: r.policy.mode };
  }

  /** Replaces a running sandbox's egress policy (a task's phase switch). */
  async setNetwork(id: string, req: NetworkPolicyRequest): Promise<NetworkPolicyResult> {
    const r = await (await this.#runningOn(id)).setNetwork(id, checkPolicy(req));
    const result = { ...networkState(r), appliedMs: r.appliedMs };
    // The request as given (names, not the addresses they resolved to): a replay resolves again.
    await this.trajectory.append(id, { kind: 'network.set', request: { ...req }, result: { mode: result.mode, allow: result.allow } });
    return result;
  }

  /** A read of the policy the edge keeps: a paused sandbox has one too (it stays in force across the pause). */
  async getNetwork(id: string): Promise<NetworkPolicyState> {
    const s = await this.get(id);
    if (s.status === 'paused') return networkState(await this.#edge(s.edge).getNetwork(id));
    return networkState(await (await this.#runningOn(id)).getNetwork(id));
  }

  // --- TTL and idle timeout -------------------------------------------------------------------

  /** Sets when a sandbox expires (E2B's setTimeout); its TTL becomes the span from creation to then. */
  async setExpiry(id: string, expiresAt: number): Promise<SandboxInfo> {
    const s = await this.get(id);
    const ttl = Math.max(1, Math.ceil((expiresAt - Date.parse(s.createdAt)) / 1000));
    await this.store.setExpiry(id, ttl, Date.parse(s.createdAt) + ttl * 1000);
    return await this.get(id);
  }

  /**
   * Applies the TTL and idle policies: a running sandbox past its TTL or idle for longer than its
   * timeout is stopped (resources freed, record kept with the reason) or paused. Expiries live in
   * the state store, so one that passed while dsec was down applies at the first sweep after start.
   */
  async sweepExpired(now = Date.now()): Promise<string[]> {
    const done: string[] = [];
    await this.ended.expire(now);
    await this.owned.sweep(now);
    for (const e of await this.store.expired(now)) {
      try {
        const s = await this.get(e.id);
        if (e.onExpiry === 'pause' && s.status === 'running') {
          await this.pause(e.id);
        } else if (e.onExpiry === 'stop') {
          await this.#edge(s.edge)
            .killSandbox(e.id)
            .then(
              () => this.metrics.observeKill(s.backend, 'expiry'),
              (err: unknown) => {
                if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
              },
            );
          await this.store.setStatus(e.id, 'stopped', e.why);
        }
        done.push(e.id);
        this.log.info({ sandbox: e.id, action: e.onExpiry, why: e.why }, 'sandbox expired');
      } catch (err) {
        this.log.error({ err, sandbox: e.id }, 'applying expiry failed');
      }
    }
    return done;
  }

  /**
   * Runs sweepExpired (and the takeover of abandoned creates) every `intervalMs` on the replica
   * holding the expiry lease, and renews this replica's create leases, until the returned stop
   * function is called.
   */
  startExpiryLoop(intervalMs = 1000): () => void {
    let running = false;
    const timer = setInterval(() => {
      if (running) return;
      running = true;
      // One replica sweeps: the one holding the lease, renewed at each sweep. It also takes over
      // the creates of replicas that died mid-create (create-leases.ts).
      void this.store
        .lease('expiry', this.replicaId, EXPIRY_LEASE_MS)
        .then(async (mine) => {
          if (!mine) return;
          await this.sweepExpired();
          await this.createLeases.takeOver();
        })
        .catch((err: unknown) => this.log.error({ err }, 'expiry sweep failed'))
        .finally(() => (running = false));
    }, intervalMs);
    timer.unref();
    const stopRenewing = this.createLeases.startRenewing(intervalMs);
    return () => {
      clearInterval(timer);
      stopRenewing();
      void this.store.releaseLease('expiry', this.replicaId).catch(() => undefined);
    };
  }

  /**
   * A TCP connection to `port` on a running sandbox's loopback, as a byte stream (the port proxy
   * and tunnel); counts as activity for the idle timeout. Not logged in the trajectory: traffic
   * to a port is the sandbox's own, like its outbound traffic.
   */
  async openPort(id: string, port: number): Promise<Duplex> {
    return (await this.#runningOn(id)).openPort(id, port);
  }

  /** The edge of a running sandbox, for calls that change nothing worth logging. */
  edgeFor(id: string): Promise<EdgeApi> {
    return this.#runningOn(id);
  }

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    checkCommand(req);
    if (req.uncapped) {
      throw new ApiError(
        'INVALID_REQUEST',
        'uncapped applies to streamed exec (Accept: application/x-ndjson); a buffered result is capped at maxOutputBytes (at most 64 MiB)',
        {
          field: 'uncapped',
        },
      );
    }
    const result = await (await this.#runningOn(id)).exec(id, req, signal);
    this.metrics.observeExec('exec', result.durationMs);
    await this.trajectory.append(id, {
      kind: 'exec',
      request: withoutStdin(req),
      result,
      durationMs: result.durationMs,
      exitCode: result.exitCode,
      payload: stdinPayload(req),
    });
    return result;
  }

  /** Streams a command's output; the log gets the exit and the output that passed through (capped). */
  async execStream(id: string, req: ExecRequest, signal?: AbortSignal): Promise<AsyncGenerator<ExecEvent>> {
    // Checked now, not at the first next(): a bad request fails before any response is streamed.
    checkCommand(req);
    return this.#logStream(id, await this.#runningOn(id), req, signal);
  }

  async *#logStream(id: string, edge: EdgeApi, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
    const kept = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const enc = req.encoding ?? 'utf8';
    let keptBytes = 0;
    let logged = false;
    const started = performance.now();
    try {
      for await (const ev of edge.execStream(id, req, signal)) {
        if (ev.type === 'exit') {
          this.metrics.observeExec('stream', ev.result.durationMs);
          const result = {
            ...ev.result,
            stdout: Buffer.concat(kept.stdout).toString(enc),
            stderr: Buffer.concat(kept.stderr).toString(enc),
          };
          await this.trajectory.append(id, {
            kind: 'exec',
            request: withoutStdin(req),
            result,
            durationMs: ev.result.durationMs,
            exitCode: ev.result.exitCode,
            payload: stdinPayload(req),
          });
          logged = true;
        } else if (keptBytes < 2 * MAX_LOGGED_OUTPUT) {
          kept[ev.type].push(ev.data);
          keptBytes += ev.data.length;
        }
        yield ev;
      }
    } finally {
      // The client went away mid-stream: the command was killed, but what it did so far happened.
      if (!logged) {
        const result = {
          disconnected: true,
          stdout: Buffer.concat(kept.stdout).toString(enc),
          stderr: Buffer.concat(kept.stderr).toString(enc),
        };
        await this.trajectory.append(id, {
          kind: 'exec',
          request: withoutStdin(req),
          result,
          durationMs: performance.now() - started,
          payload: stdinPayload(req),
        });
      }
    }
  }

  /** Background processes change state too: logged so a replay starts them again. */
  async startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    checkCommand({ cmd: req.cmd });
    const info = await (await this.#runningOn(id)).startProcess(id, req);
    await this.trajectory.append(id, { kind: 'process.start', request: { ...req }, result: { processId: info.id } });
    return info;
  }

  /** A signal (SIGKILL: the process's kill) changes the sandbox: logged so a replay sends it too. */
  async signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const info = await (await this.#runningOn(id)).signalProcess(id, pid, signal);
    await this.trajectory.append(id, { kind: 'process.signal', request: { processId: pid, signal } });
    return info;
  }

  /** Bytes written to a process's stdin are kept (up to MAX_PAYLOAD) so a replay writes them again. */
  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    await (await this.#runningOn(id)).writeProcessStdin(id, pid, data, eof);
    await this.trajectory.append(id, { kind: 'process.stdin', request: { processId: pid, bytes: data.length, eof }, payload: data });
  }

  async openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const info = await (await this.#runningOn(id)).openSession(id, req);
    await this.trajectory.append(id, { kind: 'session.open', request: { ...req }, result: { sessionId: info.id, shell: info.shell } });
    return info;
  }

  async sessionExec(
    id: string,
    sid: string,
    req: SessionExecRequest,
    signal?: AbortSignal,
  ): Promise<ExecResult & { sessionAlive: boolean }> {
    const result = await (await this.#runningOn(id)).sessionExec(id, sid, req, signal);
    this.metrics.observeExec('session', result.durationMs);
    await this.trajectory.append(id, {
      kind: 'session.exec',
      request: { sessionId: sid, ...req },
      result,
      durationMs: result.durationMs,
      exitCode: result.exitCode,
    });
    return result;
  }

  /** Idempotent like kill: closing a session that is already closed (or gone) succeeds. */
  async closeSession(id: string, sid: string): Promise<void> {
    try {
      await (await this.#runningOn(id)).closeSession(id, sid);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'SESSION_NOT_FOUND') return;
      throw err;
    }
    await this.trajectory.append(id, { kind: 'session.close', request: { sessionId: sid } });
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return (await this.#runningOn(id)).readFile(id, path, maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    const bytes = await (await this.#runningOn(id)).writeFile(id, path, data, mode);
    await this.trajectory.append(id, { kind: 'files.write', request: { path, mode: mode.toString(8), bytes }, payload: data });
    return bytes;
  }

  async makeDir(id: string, path: string, parents: boolean): Promise<void> {
    await (await this.#runningOn(id)).makeDir(id, path, parents);
    await this.trajectory.append(id, { kind: 'files.mkdir', request: { path, parents } });
  }

  async removePath(id: string, path: string, recursive: boolean): Promise<void> {
    await (await this.#runningOn(id)).removePath(id, path, recursive);
    await this.trajectory.append(id, { kind: 'files.remove', request: { path, recursive } });
  }

  async renamePath(id: string, from: string, to: string): Promise<void> {
    await (await this.#runningOn(id)).renamePath(id, from, to);
    await this.trajectory.append(id, { kind: 'files.rename', request: { from, to } });
  }

  /** Tar uploads are kept for replay up to MAX_PAYLOAD; a larger one marks the step unreplayable. */
  async uploadTar(id: string, dir: string, body: Readable): Promise<number> {
    const edge = await this.#runningOn(id);
    const copy: Buffer[] = [];
    let size = 0;
    const tee = async function* (): AsyncGenerator<Buffer> {
      for await (const chunk of body) {
        const b = chunk as Buffer;
        size += b.length;
        if (size <= MAX_PAYLOAD) copy.push(b);
        yield b;
      }
    };
    const bytes = await edge.uploadTar(id, dir, Readable.from(tee()));
    await this.trajectory.append(id, {
      kind: 'files.upload',
      request: { path: dir, bytes },
      payload: size <= MAX_PAYLOAD ? Buffer.concat(copy) : Buffer.alloc(MAX_PAYLOAD + 1),
    });
    return bytes;
  }

  /**
   * Rebuilds a sandbox from its trajectory: a new sandbox from the original's exact image and
   * spec, the logged steps re-run in order, and the original log copied to the new sandbox, so the
   * trainer reads the results it already consumed from the log and continues from there.
   */
  async replay(id: string): Promise<ReplayResult> {
    const orig = await this.get(id);
    const spec = (await this.store.getSpec<CreateSandboxRequest>(id)) ?? {
      image: orig.imageId,
      resources: orig.resources,
      labels: orig.labels,
    };
    // A lost sandbox is rebuilt on another edge: node labels that pinned it to the lost one go.
    if (orig.status === 'lost' && spec.placement?.labels) {
      const { labels: _pinned, ...placement } = spec.placement;
      spec.placement = placement;
    }
    const created = await this.create(
      { ...spec, image: orig.imageId, labels: { ...(spec.labels ?? {}), 'dsec.replay-of': id } },
      {},
      { project: orig.project ?? DEFAULT_PROJECT },
    );
    const steps = await replayEntries(this.#edge(created.edge), created.id, this.trajectory.replayable(id), { policy: checkPolicy });
    await this.trajectory.copy(id, created.id);
    const ran = steps.filter((s) => !s.skipped);
    return {
      sandbox: created,
      replayed: ran.length,
      diverged: ran.filter((s) => s.diverged).length,
      skipped: steps.length - ran.length,
      steps,
    };
  }

  /** Every edge, from the facts its heartbeats brought. */
  async nodes(): Promise<NodeInfo[]> {
    await this.edges.refreshLocal();
    return this.edges.describe().map((e) => {
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
    await this.edges.drain(id);
    return (await this.nodes()).find((n) => n.id === id)!;
  }

  /** Kills every sandbox carrying all these labels, 32 at a time; returns how many went. */
  async killByLabels(labels: Record<string, string>): Promise<number> {
    const ids = (await this.store.listSandboxes({ labels })).map((s) => s.id);
    let next = 0;
    let killed = 0;
    const worker = async (): Promise<void> => {
      while (next < ids.length) {
        const id = ids[next++]!;
        try {
          await this.kill(id);
          killed++;
        } catch (err) {
          this.log.error({ err, sandbox: id }, 'kill by label failed');
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(32, ids.length) }, worker));
    return killed;
  }

  /** Kills every sandbox (used by `dsec demo` cleanup and tests). */
  async killAll(): Promise<void> {
    await Promise.allSettled((await this.store.listSandboxes()).map((s) => this.kill(s.id)));
  }
}

/**
 * Checks the schema cannot express: an argv's program is not empty (a body `cmd: ""` can arrive
 * as `[""]`), and stdin decodes to at most MAX_STDIN_BYTES.
 */
export function checkCommand(req: {
  cmd: string | string[];
  stdin?: string | undefined;
  stdinEncoding?: 'utf8' | 'base64' | undefined;
}): void {
  const program = Array.isArray(req.cmd) ? req.cmd[0] : req.cmd;
  if (!program)
    throw new ApiError('INVALID_REQUEST', 'cmd is empty: give a shell command line or an argv whose first item is the program', {
      field: 'cmd',
    });
  if (req.stdin !== undefined && Buffer.byteLength(req.stdin, req.stdinEncoding ?? 'utf8') > MAX_STDIN_BYTES) {
    throw new ApiError(
      'PAYLOAD_TOO_LARGE',
      `stdin is over ${MAX_STDIN_BYTES} bytes; stream larger input to a background process (POST …/processes/{pid}/stdin)`,
      {
        field: 'stdin',
        limit: MAX_STDIN_BYTES,
      },
    );
  }
}

/** The log keeps stdin as a payload (bytes), not inside the JSON request. */
function withoutStdin(req: ExecRequest): Record<string, unknown> {
  const { stdin, ...rest } = req;
  return stdin === undefined ? { ...rest } : { ...rest, stdinBytes: Buffer.byteLength(stdin, req.stdinEncoding ?? 'utf8') };
}

function stdinPayload(req: ExecRequest): Buffer | undefined {
  return req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8');
}

function networkState(r: { policy: NetworkPolicy; link?: Link }): NetworkPolicyState {
  const out: NetworkPolicyState = { mode: r.policy.mode, allow: r.policy.allow };
  if (r.link) {
    out.address = r.link.sandbox;
    out.gateway = r.link.host;
  }
  return out;
}
