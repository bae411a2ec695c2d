/** `dsec bench cluster`'s options and result: shared by the run (cluster.ts, cluster-real.ts) and its rendering (cluster-report.ts). */
import type { LatencySummary } from '../latency.js';
import type { ScenarioResult } from '../result-types.js';

export interface ClusterOptions {
  /** Simulated edges joined to the control plane. @default 3 */
  edges: number;
  /** Concurrent clients creating sandboxes (keep-alive HTTP, one request in flight each). @default 64 */
  clients: number;
  /** Creates in the rate phase. @default 5000 */
  creates: number;
  /** Creates just before the rate phase, timed apart (RatePhase.warmup). @default 20000 */
  warmup: number;
  /** Sandboxes in the batch phase (32000: the job size). @default 2000 */
  batchCount: number;
  /** The batch's creates in flight (its `concurrency`); 0 sends none, so the API's default (64 per edge) applies. @default 0 */
  batchConcurrency: number;
  /** Sandboxes each way in the real run (three crun edges vs the all-in-one); 0 skips it. @default 60 */
  realCount: number;
  /** Sandboxes in the simulated edges' hold phase (filled with batches, then read under no other load); 0 skips it. @default 0 */
  hold: number;
  /**
   * The control plane's state store: empty for SQLite in its data dir, or a postgres:// URL of an
   * empty database (the run fills it; use a fresh one each run). @default ''
   */
  store: string;
  /** Sandboxes (create + exec) in flight in the real run. @default 8 */
  realConcurrency: number;
}

/** Sandboxes per edge, by edge id. */
export type PerEdge = Record<string, number>;

export interface RatePhase {
  clients: number;
  creates: number;
  ok: number;
  errors: string[];
  seconds: number;
  createsPerSecond: number;
  /** Each create as its client waits (POST /v1/sandboxes → 201). */
  latency: LatencySummary;
  perEdge: PerEdge;
  /** CPU seconds each process spent in the phase, and per create (µs). */
  cpu: { process: string; seconds: number; usPerCreate: number }[];
  /**
   * The share of the phase's wall time the control plane's event loop was busy (0–1, its
   * dsec_event_loop_busy_seconds_total): near 1 its one thread is the limit, not the machine.
   */
  controlLoopBusy?: number | undefined;
  /**
   * The creates made just before, unmeasured but timed: a fresh control plane's first creates run
   * through code V8 has not yet compiled (its JIT), and the simulated edges' too. Absent in
   * results from before the tenth stop (a 1,000-create warm-up, not timed).
   */
  warmup?: { creates: number; ok: number; seconds: number; createsPerSecond: number } | undefined;
}

export interface BatchPhase {
  /** `batch-api`: one POST /v1/batches; `individual-creates`: concurrent POST /v1/sandboxes (no batch API on this build). */
  mode: 'batch-api' | 'individual-creates';
  note: string;
  count: number;
  placed: number;
  failed: number;
  errors: string[];
  /** The batch accepted (202), or 0 for individual creates (each is accepted as it is placed). */
  acceptedSeconds: number;
  /** From the request to the last sandbox placed on an edge (or failed). */
  placedSeconds: number;
  /** From the request to the last sandbox running (or failed): the same as placed for individual creates, which answer once it runs. */
  runningSeconds: number;
  placedPerSecond: number;
  perEdge: PerEdge;
  /** (max/min − 1) × 100 of the sandboxes per edge. */
  spreadPct: number;
  /** GET /v1/nodes (the control plane's own read: no edge call) by one more client while the batch runs: the API's latency under that load. */
  readLatency: LatencySummary;
  /** Each create's latency (individual-creates only). */
  createLatency: LatencySummary;
  /** CPU each process spent from the request to the last event, per sandbox placed (absent in results from before it was measured). */
  cpu?: { process: string; seconds: number; usPerCreate: number }[];
  /** As RatePhase.controlLoopBusy, over the batch (batch-api mode). */
  controlLoopBusy?: number | undefined;
}

/** Where a create's time goes, each part measured alone in the benchmark's process. */
export interface CreateCosts {
  /** The state store's writes of one create (insert with its spec, then status → running), on a fresh SQLite file: µs. */
  sqliteWritesUs: number;
  /** One create over the edge protocol (HttpEdgeClient → a simulated edge in this process, loopback HTTP + validation): µs. */
  edgeCallUs: number;
  /** One create through the public API with one client, nothing else in flight: µs. */
  serialCreateUs: number;
}

export interface RealSide {
  description: string;
  completed: number;
  seconds: number;
  perSecond: number;
  create: LatencySummary;
  createExec: LatencySummary;
  perEdge: PerEdge;
  errors: string[];
}

export interface RealRun {
  /** Sandboxes per side, over all its rounds. */
  count: number;
  concurrency: number;
  /** Rounds per side, alternating ABBA (absent in runs from before rounds). */
  rounds?: number;
  allInOne: RealSide;
  cluster: RealSide;
}

/** The hold phase: `sandboxes` held by one control plane, then each read measured alone (issue 31). */
export interface HoldPhase {
  sandboxes: number;
  edges: number;
  /** Batches of at most 32,000 it was filled with, and how long that took. */
  batches: number;
  fillSeconds: number;
  fillFailed: number;
  /** GET /v1/sandboxes/{id}, random ids of the held sandboxes, one at a time. */
  get: LatencySummary;
  /** GET /v1/sandboxes?label=k=v selecting `smallCount` sandboxes. */
  listSmall: LatencySummary & { selected: number };
  /** The same selecting a whole batch (32,000 at full size), page by page (`pageSize`; one page when the API does not page). */
  listLarge: LatencySummary & { selected: number; pages: number; pageSize: number; totalMs: number };
  /** GET /v1/sandboxes?status=running, pages of `pageSize` one after another by cursor (absent before this field was measured). */
  listStatus?: LatencySummary & { pageSize: number };
  /** GET /metrics, ~20 scrapes. */
  metrics: LatencySummary & { bytes: number };
  /** The dashboard's overview: every request its page makes, at once (as the browser does), until the last answers. */
  overview: LatencySummary & { requests: string[] };
  /** GET /v1/batches/{id} of a finished batch (of `count`). */
  batchInfo: LatencySummary & { batchSize: number };
  /** The control plane's resident memory (VmRSS) holding them, and its peak (VmHWM), MiB. */
  rssMiB: number;
  peakRssMiB: number;
  /** The RSS's parts (/proc/PID/status) and V8's heap (from /metrics) at the same time, MiB; absent in older results. */
  memory?: { anonMiB: number; fileMiB: number; shmemMiB: number; heapUsedMiB: number; heapTotalMiB: number; externalMiB: number };
  /** POST /v1/sandboxes/kill of one batch's label. */
  kill: {
    selected: number;
    killed: number;
    failures: number;
    seconds: number;
    /** Progress reports read before the result (0: the call answers only at the end). */
    progressReports: number;
    /** Until the first progress report (or the answer). */
    firstReportSeconds: number;
    how: string;
  };
}

export interface ClusterResult extends ScenarioResult {
  /** How the processes are laid out, and why. */
  layout: string;
  edges: string[];
  rate: RatePhase;
  batch: BatchPhase;
  costs: CreateCosts;
  /** What each simulated edge holds at the end, by its own count (every placed sandbox must be there). */
  edgeHeld: { id: string; sandboxes: number; created: number }[];
  /** Accepted by the API in every phase (placed), less what the hold phase killed: must equal the sum of edgeHeld. */
  acceptedTotal: number;
  hold?: HoldPhase;
  real: RealRun | { unavailable: string };
}
