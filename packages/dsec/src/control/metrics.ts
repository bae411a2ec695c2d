import { performance } from 'node:perf_hooks';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { ClusterMetrics, type ClusterView } from './cluster-metrics.js';
import { RecentEvents } from './recent-events.js';

/** The events counted over the last minute as well (dsec_events_last_minute). */
type RecentEvent = 'create' | 'create_error' | 'kill' | 'exec';

/** Seconds; a create is ~10 ms on a warm node and seconds for a VM or a cold lazy layer. */
const CREATE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
/** Seconds; a `true` is ~5 ms, an agent's build step minutes. */
const EXEC_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];
const HTTP_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export type ExecKind = 'exec' | 'stream' | 'session';

/**
 * The control plane's Prometheus metrics (prom-client), one registry per control plane so two in
 * one process (tests, benchmarks) never share counters. Events are counted where the work happens
 * (create, kill, exec in the control plane; requests in a server hook), so every way in counts:
 * the create route, batches, fork, replay, E2B's API. What edges and the store hold (sandboxes by
 * state, capacity, layer caches, batch progress) is read at each scrape (cluster-metrics.ts).
 */
export class Metrics {
  readonly registry = new Registry();
  readonly #creates = new Counter({
    name: 'dsec_sandbox_creates_total',
    help: 'Sandboxes created (running), by backend.',
    labelNames: ['backend'] as const,
    registers: [this.registry],
  });
  readonly #createErrors = new Counter({
    name: 'dsec_sandbox_create_errors_total',
    help: 'Creates that failed, by backend and error code (the code the caller got).',
    labelNames: ['backend', 'code'] as const,
    registers: [this.registry],
  });
  readonly #createSeconds = new Histogram({
    name: 'dsec_sandbox_create_duration_seconds',
    help: 'Time from the create call to a running sandbox (placement, row, edge create), by backend; a batch group counts each item with its group’s time.',
    labelNames: ['backend'] as const,
    buckets: CREATE_BUCKETS,
    registers: [this.registry],
  });
  readonly #kills = new Counter({
    name: 'dsec_sandbox_kills_total',
    help: 'Sandboxes ended on their edge, by backend and cause (kill: a caller; expiry: TTL or idle timeout).',
    labelNames: ['backend', 'cause'] as const,
    registers: [this.registry],
  });
  readonly #killErrors = new Counter({
    name: 'dsec_sandbox_kill_errors_total',
    help: 'Kills that failed, by backend and error code.',
    labelNames: ['backend', 'code'] as const,
    registers: [this.registry],
  });
  readonly #migrations = new Counter({
    name: 'dsec_sandbox_migrations_total',
    help: 'Sandbox moves between edges, by why (api: a caller; drain: an edge drained with --migrate; burst: its pool above the burst threshold; return: back from the burst pool) and result (moved, refused, failed).',
    labelNames: ['cause', 'result'] as const,
    registers: [this.registry],
  });
  readonly #migrationSeconds = new Histogram({
    name: 'dsec_sandbox_migration_duration_seconds',
    help: 'Time a sandbox took to move (from the call to running on its new edge), by cause.',
    labelNames: ['cause'] as const,
    buckets: CREATE_BUCKETS,
    registers: [this.registry],
  });
  readonly #execSeconds = new Histogram({
    name: 'dsec_exec_duration_seconds',
    help: 'Duration of commands run in sandboxes, as the edge measured it, by kind (exec: buffered; stream: NDJSON; session: in a shell session).',
    labelNames: ['kind'] as const,
    buckets: EXEC_BUCKETS,
    registers: [this.registry],
  });
  readonly #httpSeconds = new Histogram({
    name: 'dsec_http_request_duration_seconds',
    help: 'API request latency by method, route pattern (not the raw URL) and status code; streamed responses count until their end.',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: HTTP_BUCKETS,
    registers: [this.registry],
  });
  readonly #apiErrors = new Counter({
    name: 'dsec_api_errors_total',
    help: 'Error responses by error code (from the registry) and route pattern.',
    labelNames: ['code', 'route'] as const,
    registers: [this.registry],
  });
  // Per project: counted here as the work happens, so they cost nothing at a scrape; like every
  // counter of this registry they start from zero when the control plane does (rate() treats
  // that as a counter reset).
  readonly #projectCreates = new Counter({
    name: 'dsec_project_sandbox_creates_total',
    help: 'Sandboxes created (running) in each project; a claim from a warm pool is counted in dsec_project_pool_claims_total instead.',
    labelNames: ['project'] as const,
    registers: [this.registry],
  });
  readonly #projectFnCalls = new Counter({
    name: 'dsec_project_fn_calls_total',
    help: 'Function calls (POST /v1/fn/run, each call of /v1/fn/batch) of each project, by outcome: ok (the program ran; its exit code is its own) or the error code.',
    labelNames: ['project', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly #projectPoolClaims = new Counter({
    name: 'dsec_project_pool_claims_total',
    help: 'Creates of each project answered with a ready sandbox from a warm pool, by pool.',
    labelNames: ['project', 'pool'] as const,
    registers: [this.registry],
  });
  readonly #recent: Record<RecentEvent, RecentEvents> = {
    create: new RecentEvents(),
    create_error: new RecentEvents(),
    kill: new RecentEvents(),
    exec: new RecentEvents(),
  };
  #cluster: ClusterMetrics | undefined;

  constructor(opts: { processMetrics?: boolean } = {}) {
    // process_cpu_seconds_total, process_resident_memory_bytes, nodejs_eventloop_lag_seconds, …
    if (opts.processMetrics !== false) {
      collectDefaultMetrics({ register: this.registry });
      eventLoopBusy(this.registry);
    }
    const recent = this.#recent;
    new Gauge({
      name: 'dsec_events_last_minute',
      help: 'Creates, failed creates, kills and commands (event) in the last 60 s, for a reader that looks once (dsec top --once); use rate() over the counters for graphs.',
      labelNames: ['event'] as const,
      registers: [this.registry],
      collect() {
        for (const [event, r] of Object.entries(recent)) this.set({ event }, r.total());
      },
    });
  }

  /** Gauges read from the cluster at each scrape: sandboxes by state, edges, layer caches, batches. */
  watchCluster(view: ClusterView): void {
    this.#cluster = new ClusterMetrics(this.registry, view);
  }

  observeCreate(backend: string, project: string, ms: number): void {
    this.observeCreates(backend, project, ms, 1);
  }

  /**
   * `n` creates of one backend and project that took `ms` each (a batch's group on one edge): the
   * counters once, by n. Each prom-client call checks and hashes its labels, and a batch of 32,000
   * made four of them per sandbox (2 % of the control plane's thread placing it).
   */
  observeCreates(backend: string, project: string, ms: number, n: number): void {
    if (n <= 0) return;
    this.#creates.inc({ backend }, n);
    this.#recent.create.add(n);
    this.#projectCreates.inc({ project }, n);
    const labels = { backend };
    const seconds = ms / 1000;
    for (let i = 0; i < n; i++) this.#createSeconds.observe(labels, seconds);
  }

  /** `outcome`: 'ok' when the call ran (whatever its exit code), else the error code the caller got. */
  fnCall(project: string, outcome: string): void {
    this.#projectFnCalls.inc({ project, outcome });
  }

  poolClaim(project: string, pool: string): void {
    this.#projectPoolClaims.inc({ project, pool });
  }

  createFailed(backend: string, code: string): void {
    this.#createErrors.inc({ backend, code });
    this.#recent.create_error.add();
  }

  observeKill(backend: string, cause: 'kill' | 'expiry'): void {
    this.#kills.inc({ backend, cause });
    this.#recent.kill.add();
  }

  killFailed(backend: string, code: string): void {
    this.#killErrors.inc({ backend, code });
  }

  /** A move's outcome; `ms` for one that moved. */
  observeMigration(cause: string, result: 'moved' | 'refused' | 'failed', ms?: number): void {
    this.#migrations.inc({ cause, result });
    if (result === 'moved' && ms !== undefined) this.#migrationSeconds.observe({ cause }, ms / 1000);
  }

  observeExec(kind: ExecKind, ms: number): void {
    this.#execSeconds.observe({ kind }, ms / 1000);
    this.#recent.exec.add();
  }

  observeRequest(method: string, route: string, status: number, seconds: number): void {
    this.#httpSeconds.observe({ method, route, status: String(status) }, seconds);
  }

  apiError(code: string, route: string): void {
    this.#apiErrors.inc({ code, route });
  }

  /** The text format Prometheus scrapes, with the cluster's gauges read now. */
  async render(): Promise<{ contentType: string; text: string }> {
    await this.#cluster?.refresh();
    return { contentType: this.registry.contentType, text: await this.registry.metrics() };
  }
}

/**
 * dsec_event_loop_busy_seconds_total: the time the process's event loop spent running callbacks
 * rather than waiting for I/O (Node's event-loop utilization, read at each scrape). A control
 * plane does its work on that one thread (HTTP, placement, store statements), so rate() of this
 * counter is how near the replica is to its ceiling: at 1 more creates only queue, and another
 * replica is what adds throughput. process_cpu_seconds_total cannot say it: it counts every
 * thread (the store's checkpointer, V8's compiler and collector), and lag says it only once requests
 * already wait.
 */
function eventLoopBusy(registry: Registry): void {
  let counted = 0;
  new Counter({
    name: 'dsec_event_loop_busy_seconds_total',
    help: "Time the control plane's event loop (its one JavaScript thread: HTTP, placement, store statements) spent running rather than waiting; rate() of it is the loop's utilization, from 0 to 1 (near 1: this replica is saturated, add one).",
    registers: [registry],
    collect() {
      const busy = performance.eventLoopUtilization().active / 1000;
      if (busy > counted) this.inc(busy - counted);
      counted = busy;
    },
  });
}
