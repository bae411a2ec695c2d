import type { Logger } from 'pino';
import { EdgeRegistry } from './edges/edge-registry.js';
import { BatchService } from './service/batches.js';
import { SandboxCreation } from './service/sandbox-creation.js';
import { CreateLeases } from './create-leases.js';
import type { ClusterRegistry } from './cluster/cluster-registry.js';
import type { ImageStore } from '../image/image-store.js';
import { Volumes } from './service/volumes.js';
import type { StateStore } from './state-store.js';
import { Metrics } from './metrics.js';
import { SnapshotImages } from './snapshot-images.js';
import { DEFAULT_TRAJECTORY_RETENTION_HOURS, EndedSandboxes } from './ended-sandboxes.js';
import { OwnedSandboxes } from './owned-sandboxes.js';
import { TrajectoryExport } from './trajectory-export.js';
import { TrajectoryLog } from './trajectory-log.js';
import { WarmPools } from './service/pools.js';
import { FnService } from './service/fn.js';
import { ProjectImages, SHARED_IMAGES_ONLY } from './project-images.js';
import { ProjectQuotas } from './project-quotas.js';
import { SYSTEM } from './service/callers.js';
import { ExecService } from './service/exec.js';
import { OutputBudget } from '../output-budget.js';
import { ExpiryService } from './service/expiry.js';
import { FileService } from './service/files.js';
import { NetworkService } from './service/network.js';
import { BurstMover } from './service/burst-mover.js';
import { MigrationService } from './service/migration.js';
import { NodeService } from './service/nodes.js';
import { ProjectService } from './service/projects.js';
import { ReplayService } from './service/replay.js';
import { SandboxLookup } from './service/sandbox-lookup.js';
import { SandboxService } from './service/sandboxes.js';
import { SnapshotService } from './service/snapshots.js';
import { TrajectoryService } from './service/trajectories.js';

export { DEFAULT_LIMITS, edgeOf, newSandboxId } from './sandbox-ids.js';

export interface ControlPlaneOptions {
  /** The edges; a registry with no edges (and no cluster token) when omitted. */
  edges?: EdgeRegistry;
  /** Pool that takes burstable sandboxes when their pool is above `burstThreshold` or full. */
  burstPool?: string;
  /** Utilisation (0..1) of a pool above which burstable sandboxes go to the burst pool. */
  burstThreshold?: number;
  /** Move burst-pool sandboxes back to their own pool once it has room again (BurstMover). @default false */
  burstReturn?: boolean;
  /** How long a killed sandbox's trajectory stays readable; 0 deletes it with the sandbox. @default 24 */
  trajectoryRetentionHours?: number;
  /** The cluster's OCI registry: layers are put there for edges, and joining edges are told of it. */
  registry?: ClusterRegistry;
  /**
   * This replica's name, when several control planes share one store: background work (expiry,
   * the edge watcher, batch drivers) runs on the one holding its lease. @default 'only'
   */
  replicaId?: string;
  /** Output buffered results may hold at once past the default cap (OutputBudget). @default 1 GiB */
  outputBudgetBytes?: number;
}

/** Buffered results' output budget when none is given (DSEC_OUTPUT_BUDGET_MIB's default). */
export const DEFAULT_OUTPUT_BUDGET_MIB = 1024;

/** Above 80 % of a pool's slots or memory, burstable sandboxes go to the burst pool. */
export const DEFAULT_BURST_THRESHOLD = 0.8;

/**
 * The control plane, put together: the stores, the edge registry and the services (service/) that
 * own every state change. It holds no behaviour of its own: routes, the E2B layer and the runtime
 * call its services, which take the caller and are the only code that reaches an edge.
 */
export class ControlPlane {
  readonly edges: EdgeRegistry;
  readonly replicaId: string;
  /** What buffered answers and bodies read whole may hold at once (output-budget.ts). */
  readonly outputBudget: OutputBudget;
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

  /** A sandbox's life: create, read, list, pause, resume, expiry, kill. */
  readonly sandboxes: SandboxService;
  /** Snapshots and forks. */
  readonly snapshots: SnapshotService;
  /** Egress policies and connections to a sandbox's ports. */
  readonly network: NetworkService;
  /** Commands, background processes, sessions and terminals. */
  readonly exec: ExecService;
  /** A sandbox's files. */
  readonly files: FileService;
  /** Rebuilding a sandbox from its trajectory. */
  readonly replays: ReplayService;
  /** Reading trajectories: one sandbox's (with its fork lineage), or many by label or batch. */
  readonly trajectories: TrajectoryService;
  /** Moving sandboxes between edges. */
  readonly migration: MigrationService;
  /** Idle burstable sandboxes moved to the burst pool above the threshold (and back). */
  readonly burst: BurstMover;
  /** The nodes, draining, reconciling the store with an edge. */
  readonly nodes: NodeService;
  /** TTLs and idle timeouts. */
  readonly expiry: ExpiryService;
  /** Projects, their quotas, API keys. */
  readonly projects: ProjectService;

  constructor(store: StateStore, images: ImageStore, log: Logger, opts: ControlPlaneOptions = {}) {
    this.trajectory = new TrajectoryLog(store);
    this.replicaId = opts.replicaId ?? 'only';
    this.snapshotImages = new SnapshotImages(store, images);
    this.ended = new EndedSandboxes(store, (opts.trajectoryRetentionHours ?? DEFAULT_TRAJECTORY_RETENTION_HOURS) * 3600_000);
    this.owned = new OwnedSandboxes({
      list: (labels) => this.sandboxes.list(SYSTEM, { labels }),
      kill: (id) => this.sandboxes.kill(SYSTEM, id),
      log: log.child({ component: 'owned-sandboxes' }),
    });
    this.edges = opts.edges ?? new EdgeRegistry({ store, token: '', log });
    this.quotas = new ProjectQuotas(store);
    this.projectImages = new ProjectImages(store, images);
    this.volumes = new Volumes({ store, edges: this.edges, log: log.child({ component: 'volumes' }) });
    this.registry = opts.registry;
    const registry = opts.registry;
    this.createLeases = new CreateLeases(store, this.edges, log.child({ component: 'create-leases' }), this.replicaId);
    const creation = new SandboxCreation({
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
      sandboxCounts: () => store.sandboxes.countGroups(),
      batches: () => this.batches.progress(),
      images: () => images.list(),
    });
    this.pools = new WarmPools(
      store,
      {
        create: (req, labels) => creation.create(req, labels),
        checkSpec: (req) => creation.checkSpec(req),
        kill: (id) => this.sandboxes.kill(SYSTEM, id),
      },
      log.child({ component: 'pools' }),
    );
    const outputBudget = (this.outputBudget = new OutputBudget(
      opts.outputBudgetBytes ?? DEFAULT_OUTPUT_BUDGET_MIB * 2 ** 20,
      {
        whole: "the control plane's output budget (--output-budget-mib)",
        owner: "this project's half of the control plane's output budget",
        otherwise: "retry when this project's running commands have answered",
      },
      0.5,
    ));
    this.fn = new FnService({
      edges: this.edges,
      outputBudget,
      compose: async (req, project) => creation.composeLayers(req, project ?? SHARED_IMAGES_ONLY),
      metrics: this.metrics,
      log: log.child({ component: 'fn' }),
    });
    const lookup = new SandboxLookup({ store, ended: this.ended, edges: this.edges, unclaimedIn: (id) => this.pools.unclaimedIn(id), log });
    const sandboxDeps = { store, lookup, trajectory: this.trajectory, metrics: this.metrics, log };
    this.sandboxes = new SandboxService({
      ...sandboxDeps,
      creation,
      pools: () => this.pools,
      quotas: this.quotas,
      projectImages: this.projectImages,
      snapshotImages: this.snapshotImages,
      ended: this.ended,
    });
    this.network = new NetworkService(sandboxDeps);
    this.snapshots = new SnapshotService({
      ...sandboxDeps,
      images,
      sandboxes: this.sandboxes,
      network: this.network,
      quotas: this.quotas,
      projectImages: this.projectImages,
      snapshotImages: this.snapshotImages,
    });
    this.exec = new ExecService({ ...sandboxDeps, outputBudget });
    this.files = new FileService({ ...sandboxDeps, outputBudget });
    this.replays = new ReplayService({ ...sandboxDeps, sandboxes: this.sandboxes, ended: this.ended });
    this.trajectories = new TrajectoryService({
      store,
      lookup,
      trajectory: this.trajectory,
      ended: this.ended,
      export: new TrajectoryExport({ store, trajectory: this.trajectory, ended: this.ended }),
      outputBudget,
    });
    this.projects = new ProjectService({ store, quotas: this.quotas });
    this.migration = new MigrationService({
      ...sandboxDeps,
      images,
      edges: this.edges,
      creation,
      network: this.network,
      replicaId: this.replicaId,
      ...(registry ? { layersReady: (layers: readonly string[]) => registry.ensure(layers) } : {}),
    });
    this.burst = new BurstMover({
      store,
      edges: this.edges,
      migration: this.migration,
      log: log.child({ component: 'burst' }),
      replicaId: this.replicaId,
      burst: {
        pool: opts.burstPool ?? 'burst',
        threshold: opts.burstThreshold ?? DEFAULT_BURST_THRESHOLD,
        returnHome: opts.burstReturn === true,
      },
    });
    this.nodes = new NodeService({ store, edges: this.edges, creation, migration: this.migration, trajectory: this.trajectory, log });
    this.expiry = new ExpiryService({
      ...sandboxDeps,
      sandboxes: this.sandboxes,
      ended: this.ended,
      owned: this.owned,
      createLeases: this.createLeases,
      abandonedMoves: () => this.migration.recoverAbandoned(),
      replicaId: this.replicaId,
    });
    this.batches = new BatchService(store, this.sandboxes, this.quotas, this.edges, log.child({ component: 'batches' }), this.replicaId);
    this.edges.onLost = (edge, why) => this.nodes.markLost(edge, why);
    this.edges.onBack = async (edge) => {
      await this.nodes.reconcile(edge);
    };
  }
}
