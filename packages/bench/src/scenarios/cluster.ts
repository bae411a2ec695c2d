/**
 * `dsec bench cluster`: the control plane's own create rate and a batch against SIMULATED edges,
 * and where a create's time goes. The real run (crun edges) is cluster-real.ts, the targets and
 * rendering cluster-report.ts, the options and result cluster-result.ts.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { round } from '../stats.js';
import { TARGETS } from '../targets.js';
import { HttpEdgeClient, serveSimulatedEdge, SimulatedEdge, type EdgeCreateRequest } from 'dsec/cluster';
import { StateStore } from 'dsec/runtime';
import { BATCH_CONCURRENCY_PER_EDGE, type SandboxInfo } from '@dsec/sdk/schema';
import { startControlChild, startSimulatedEdgesChild, waitForEdges } from '../cluster-processes.js';
import { BENCH_IMAGE } from '../fixture.js';
import { HttpLoadClient } from '../http-load.js';
import { summarizeLatency } from '../latency.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { pool } from '../rounds.js';
import { runReal } from './cluster-real.js';
import { runBatchApi } from './cluster-batch-api.js';
import { runHold } from './cluster-hold.js';
import { renderCluster, clusterTargets, clusterLines, clusterHeadline, storeName } from './cluster-report.js';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';
import type { PeerResultBase } from '../result-types.js';
import type { ClusterOptions, PerEdge, RatePhase, BatchPhase, CreateCosts, ClusterResult, HoldPhase } from './cluster-result.js';
import { MAX_ERRORS } from './cluster-batch-api.js';

const LAYOUT =
  'three processes: the control plane (`dsec control`, a child process), the simulated edges (one child process for all of them), ' +
  'and the load generator (the benchmark process). Apart, so the control plane does not share its event loop with the edges or the clients; ' +
  'together on the same 2 cores, so every CPU-second the edges and clients spend is one the control plane does not get.';

export const SPEC = { image: BENCH_IMAGE, resources: { memoryMiB: 64, cpu: 0.1 } };

function spreadPct(perEdge: PerEdge, edges: string[]): number {
  const counts = edges.map((e) => perEdge[e] ?? 0);
  const min = Math.min(...counts);
  const max = Math.max(...counts);
  return min > 0 ? round((max / min - 1) * 100, 2) : Infinity;
}

/** utime + stime of a process, in seconds (clock ticks of 1/100 s). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

/** CPU each of the three processes spent since `before`, in seconds and per sandbox. */
function cpuPerProcess(
  before: { control: number; edges: number; self: number },
  pids: { control: number; edges: number },
  sandboxes: number,
  edges: number,
): { process: string; seconds: number; usPerCreate: number }[] {
  const per = (s: number): number => round((s * 1e6) / Math.max(1, sandboxes), 1);
  const spent = {
    control: cpuSeconds(pids.control) - before.control,
    edges: cpuSeconds(pids.edges) - before.edges,
    self: selfCpuSeconds() - before.self,
  };
  return [
    { process: 'control plane (dsec control)', seconds: round(spent.control, 2), usPerCreate: per(spent.control) },
    { process: `simulated edges (${edges}, one process)`, seconds: round(spent.edges, 2), usPerCreate: per(spent.edges) },
    { process: 'load generator (this process)', seconds: round(spent.self, 2), usPerCreate: per(spent.self) },
  ];
}

function selfCpuSeconds(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

/** `count` creates, `clients` at a time, over keep-alive HTTP. */
async function createMany(
  http: HttpLoadClient,
  count: number,
  clients: number,
  signal: AbortSignal,
): Promise<{ ok: number; errors: string[]; lat: number[]; perEdge: PerEdge; ids: string[] }> {
  const errors: string[] = [];
  const lat: number[] = [];
  const perEdge: PerEdge = {};
  const ids: string[] = [];
  let failures = 0;
  await pool(count, clients, async () => {
    if (signal.aborted || failures >= MAX_ERRORS * 4) return;
    const r = await http.call('POST', '/v1/sandboxes', SPEC);
    if (r.status !== 201) {
      failures++;
      if (errors.length < MAX_ERRORS) errors.push(`HTTP ${r.status}: ${JSON.stringify(r.body).slice(0, 300)}`);
      return;
    }
    const sb = r.body as SandboxInfo;
    lat.push(r.ms);
    ids.push(sb.id);
    perEdge[sb.edge] = (perEdge[sb.edge] ?? 0) + 1;
  });
  signal.throwIfAborted();
  return { ok: lat.length, errors, lat, perEdge, ids };
}

/**
 * The control plane's event loop's busy seconds so far (its dsec_event_loop_busy_seconds_total;
 * undefined from a build without it): over a phase, busy ÷ wall time is how near its one thread
 * was to saturation.
 */
async function loopBusySeconds(http: HttpLoadClient): Promise<{ busy: number; at: number } | undefined> {
  const r = await http.call('GET', '/metrics');
  const m = r.status === 200 && typeof r.body === 'string' ? /^dsec_event_loop_busy_seconds_total (\S+)$/m.exec(r.body) : null;
  return m ? { busy: Number(m[1]), at: performance.now() } : undefined;
}

/** The share of a phase's wall time the control plane's event loop was busy (0–1), from two loopBusySeconds. */
function loopShare(a: { busy: number; at: number } | undefined, b: { busy: number; at: number } | undefined): number | undefined {
  return a && b && b.at > a.at ? round((b.busy - a.busy) / ((b.at - a.at) / 1000), 3) : undefined;
}

/** Reads one URL over and over (10 ms apart) until stopped: the API's latency while the load runs. */
function probe(http: HttpLoadClient, path: string): { stop: () => Promise<number[]> } {
  const lat: number[] = [];
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const r = await http.call('GET', path);
      if (r.status === 200) lat.push(r.ms);
      await new Promise((res) => setTimeout(res, 10));
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
      return lat;
    },
  };
}

/** Where a create's time goes: its parts measured one at a time, in this process. */
async function measureCosts(dir: string, token: string, http: HttpLoadClient): Promise<CreateCosts & { accepted: number }> {
  const n = 2000;
  const store = await StateStore.open(join(dir, 'costs.db'));
  let sqliteWritesUs: number;
  try {
    const base: SandboxInfo = {
      id: '',
      edge: 'x',
      backend: 'container',
      status: 'creating',
      image: 'busybox',
      imageId: 'img',
      resources: { cpu: 1, memoryMiB: 64, pids: 512 },
      labels: {},
      layers: [`sha256:${'0'.repeat(64)}`],
      createdAt: new Date().toISOString(),
      onExpiry: 'stop',
      lastActivityAt: new Date().toISOString(),
    };
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const info = { ...base, id: `sb-x-${String(i).padStart(13, '0')}` };
      await store.sandboxes.insert(info, undefined, SPEC); // with its spec, in one transaction, as ControlPlane.create writes it
      await store.sandboxes.setStatus(info.id, 'running');
    }
    sqliteWritesUs = round(((performance.now() - t0) * 1000) / n, 1);
  } finally {
    await store.close();
  }
  // One simulated edge in this process (not joined), called over loopback HTTP the way the control plane calls any edge.
  const sim = new SimulatedEdge('costprobe');
  const served = await serveSimulatedEdge(sim, { token });
  let edgeCallUs: number;
  try {
    const client = new HttpEdgeClient(sim.id, served.url, token);
    const req: Omit<EdgeCreateRequest, 'id'> = {
      layers: [`sha256:${'0'.repeat(64)}`],
      config: { env: [], cwd: '/', user: '0:0', entrypoint: [], cmd: ['sh'], labels: {} },
      env: {},
      limits: { cpu: 1, memoryMiB: 64, pids: 512 },
    };
    for (let i = 0; i < 100; i++) await client.createSandbox({ ...req, id: `sb-costprobe-w${String(i).padStart(12, '0')}` });
    const t0 = performance.now();
    for (let i = 0; i < 500; i++) await client.createSandbox({ ...req, id: `sb-costprobe-${String(i).padStart(13, '0')}` });
    edgeCallUs = round(((performance.now() - t0) * 1000) / 500, 1);
  } finally {
    await served.server.close();
  }
  const lat: number[] = [];
  for (let i = 0; i < 300; i++) {
    const r = await http.call('POST', '/v1/sandboxes', SPEC);
    if (r.status === 201) lat.push(r.ms);
  }
  const s = summarizeLatency(lat);
  return { sqliteWritesUs, edgeCallUs, serialCreateUs: round(s.p50 * 1000, 1), accepted: lat.length };
}

export async function runCluster(peers: Peer[], opts: ClusterOptions, ctx: ScenarioContext): Promise<ClusterResult> {
  const { names, say, signal } = ctx;
  const dir = join(names.dir, 'cluster');
  mkdirSync(dir, { recursive: true });
  const dropped: PeerUnavailable[] = [];
  if (opts.hold > 0 && opts.edges < TARGETS.clusterHoldEdges)
    throw new Error(`--hold needs --edges ≥ ${TARGETS.clusterHoldEdges} (issue 31's cluster): got --edges ${opts.edges}`);
  if (opts.store && !/^postgres(ql)?:\/\//.test(opts.store))
    throw new Error(`--store: a postgres:// URL, or nothing for SQLite; got ${opts.store}`);
  say(
    `control plane: dsec control in a child process (${join(dir, 'control')}; state in ${storeName(opts.store)}), busybox built through its API…`,
  );
  const control = await startControlChild(join(dir, 'control'), opts.store || undefined);
  let edges: Awaited<ReturnType<typeof startSimulatedEdgesChild>> | undefined;
  const http = new HttpLoadClient(control.url, control.apiKey, opts.clients + 1);
  try {
    say(`${opts.edges} SIMULATED edges (accept at once, no crun) in one child process, joining like dsec edge…`);
    edges = await startSimulatedEdgesChild({
      join: control.url,
      token: control.joinToken,
      count: opts.edges,
      idPrefix: `${names.edgeId}s`,
      runDir: names.dir,
    });
    const edgeIds = edges.edges.map((e) => e.id);
    await waitForEdges(control.url, control.apiKey, edgeIds);

    say('where a create goes: SQLite writes, one edge call, one serial create…');
    const { accepted: serial, ...costs } = await measureCosts(dir, control.joinToken, http);
    say(`  sqlite ${costs.sqliteWritesUs} µs, edge call ${costs.edgeCallUs} µs, serial create p50 ${costs.serialCreateUs} µs`);
    let accepted = serial;

    say(`rate: ${opts.creates} creates, ${opts.clients} concurrent clients (keep-alive HTTP)…`);
    // Warm-up (V8's JIT in every process, the sockets), timed apart: the sustained rate is the
    // measured phase's; the warm-up's rate is what a fresh control plane's first creates see.
    const w0 = performance.now();
    const warm = await createMany(http, opts.warmup, opts.clients, signal);
    const warmSeconds = (performance.now() - w0) / 1000;
    accepted += warm.ok;
    const pids = { control: control.child.proc.pid!, edges: edges.child.proc.pid! };
    const loop0 = await loopBusySeconds(http);
    const cpu0 = { control: cpuSeconds(pids.control), edges: cpuSeconds(pids.edges), self: selfCpuSeconds() };
    const t0 = performance.now();
    const a = await createMany(http, opts.creates, opts.clients, signal);
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = { control: cpuSeconds(pids.control), edges: cpuSeconds(pids.edges), self: selfCpuSeconds() };
    const loop1 = await loopBusySeconds(http);
    accepted += a.ok;
    const per = (s: number): number => round((s * 1e6) / Math.max(1, a.ok), 1);
    const rate: RatePhase = {
      clients: opts.clients,
      creates: opts.creates,
      ok: a.ok,
      errors: a.errors,
      seconds: round(seconds, 3),
      createsPerSecond: round(a.ok / seconds, 1),
      latency: summarizeLatency(a.lat),
      perEdge: a.perEdge,
      cpu: [
        {
          process: 'control plane (dsec control)',
          seconds: round(cpu1.control - cpu0.control, 2),
          usPerCreate: per(cpu1.control - cpu0.control),
        },
        {
          process: `simulated edges (${opts.edges}, one process)`,
          seconds: round(cpu1.edges - cpu0.edges, 2),
          usPerCreate: per(cpu1.edges - cpu0.edges),
        },
        { process: 'load generator (this process)', seconds: round(cpu1.self - cpu0.self, 2), usPerCreate: per(cpu1.self - cpu0.self) },
      ],
      controlLoopBusy: loopShare(loop0, loop1),
      warmup:
        opts.warmup > 0
          ? { creates: opts.warmup, ok: warm.ok, seconds: round(warmSeconds, 3), createsPerSecond: round(warm.ok / warmSeconds, 1) }
          : undefined,
    };
    say(
      `  ${a.ok} in ${round(seconds, 2)} s = ${rate.createsPerSecond}/s, p50 ${rate.latency.p50} ms` +
        (rate.warmup ? ` (after a warm-up of ${rate.warmup.ok} at ${rate.warmup.createsPerSecond}/s)` : ' (no warm-up)'),
    );

    say(`batch: ${opts.batchCount} sandboxes from accepted to all placed…`);
    const probed = probe(http, '/v1/nodes');
    let batch: BatchPhase;
    const batchLoop0 = await loopBusySeconds(http);
    const batchCpu0 = { control: cpuSeconds(pids.control), edges: cpuSeconds(pids.edges), self: selfCpuSeconds() };
    const viaApi = await runBatchApi(
      control.url,
      control.apiKey,
      { count: opts.batchCount, spec: SPEC, ...(opts.batchConcurrency > 0 ? { concurrency: opts.batchConcurrency } : {}) },
      signal,
    );
    if (viaApi) {
      // The CPU first: the scrape of the event loop's share is not the batch's work.
      const cpu = cpuPerProcess(batchCpu0, pids, viaApi.placed, opts.edges);
      const batchLoop1 = await loopBusySeconds(http);
      const readLatency = summarizeLatency(await probed.stop());
      batch = {
        controlLoopBusy: loopShare(batchLoop0, batchLoop1),
        mode: 'batch-api',
        note: `one POST /v1/batches {count: ${opts.batchCount}${opts.batchConcurrency > 0 ? `, concurrency: ${opts.batchConcurrency}` : ''}}${opts.batchConcurrency > 0 ? '' : ` (the API's default concurrency: ${BATCH_CONCURRENCY_PER_EDGE} per edge)`}; times from its NDJSON events`,
        ...viaApi,
        spreadPct: spreadPct(viaApi.perEdge, edgeIds),
        readLatency,
        createLatency: summarizeLatency([]),
        cpu,
      };
    } else {
      const tb = performance.now();
      const b = await createMany(http, opts.batchCount, opts.clients, signal);
      const placedSeconds = (performance.now() - tb) / 1000;
      const readLatency = summarizeLatency(await probed.stop());
      batch = {
        mode: 'individual-creates',
        note: `POST /v1/batches is not on this build (404 ROUTE_NOT_FOUND): measured as ${opts.batchCount} individual creates, ${opts.clients} concurrent clients`,
        count: opts.batchCount,
        placed: b.ok,
        failed: opts.batchCount - b.ok,
        errors: b.errors,
        acceptedSeconds: 0,
        placedSeconds: round(placedSeconds, 3),
        runningSeconds: round(placedSeconds, 3),
        placedPerSecond: round(b.ok / placedSeconds, 1),
        perEdge: b.perEdge,
        spreadPct: spreadPct(b.perEdge, edgeIds),
        readLatency,
        createLatency: summarizeLatency(b.lat),
      };
    }
    accepted += batch.placed;
    say(`  ${batch.placed} placed in ${batch.placedSeconds} s (${batch.mode}); spread ${batch.spreadPct} %`);
    let hold: HoldPhase | undefined;
    if (opts.hold > 0) {
      say(`hold: ${opts.hold} sandboxes on ${opts.edges} simulated edges, then each read alone…`);
      hold = await runHold(
        { url: control.url, apiKey: control.apiKey, pid: control.child.proc.pid!, edges: opts.edges },
        opts.hold,
        say,
        signal,
      );
      accepted += hold.sandboxes - hold.kill.killed;
    }
    const edgeHeld = await edges.stats();

    const real = opts.realCount > 0 ? await runReal(peers, opts, ctx) : { unavailable: 'skipped (--real-count 0)' };
    if ('unavailable' in real && opts.realCount > 0) dropped.push({ name: 'dsec', reason: `real run: ${real.unavailable}` });
    const aio = peers.find((p) => p.name === 'dsec');
    const peerBase: PeerResultBase = {
      name: 'dsec',
      description: 'dsec control (child process) + simulated edges (child process); load: raw keep-alive HTTP to the public API',
      version: aio?.version ?? 'dsec',
      errors: [...a.errors, ...batch.errors],
    };
    return {
      peers: [peerBase],
      dropped,
      layout: LAYOUT,
      edges: edgeIds,
      rate,
      batch,
      costs,
      edgeHeld,
      acceptedTotal: accepted,
      real,
      ...(hold ? { hold } : {}),
    };
  } finally {
    http.close();
    await edges?.child.stop();
    await control.child.stop();
  }
}

export const clusterScenario: BenchScenarioDef<ClusterOptions, ClusterResult> = {
  name: 'cluster',
  summary: "the control plane's own create rate and a batch against N SIMULATED edges; a real run of 3 crun edges vs the all-in-one",
  flags: [
    { key: 'edges', long: 'edges', description: 'simulated edges', default: 3, min: 1 },
    { key: 'clients', long: 'clients', short: 'c', description: 'concurrent clients creating sandboxes', default: 64, min: 1 },
    { key: 'creates', long: 'creates', short: 'n', description: 'creates in the rate phase', default: 5000, min: 1 },
    {
      key: 'warmup',
      long: 'warmup',
      description: "creates just before the rate phase, timed apart (a fresh control plane's JIT warm-up)",
      // V8 was still optimizing the create path's functions 10 s into a rate phase after 5,000:
      // ~350 TurboFan compiles, 131 in its first second, tapering to a few a second by its end
      // (`--log-code`), ~12 % of the control plane's CPU on its compiler thread. A control plane
      // serving a trainer runs for hours; the rate phase measures that, the warm-up's own rate
      // (reported) what a fresh one's first creates see.
      default: 20000,
      min: 0,
    },
    { key: 'batchCount', long: 'batch-count', description: "sandboxes in the batch (32000: the issue's job)", default: 2000, min: 1 },
    {
      key: 'batchConcurrency',
      long: 'batch-concurrency',
      description: "the batch's creates in flight (its concurrency; 0: the API's default, 64 per edge)",
      default: 0,
      min: 0,
    },
    {
      key: 'realCount',
      long: 'real-count',
      description: 'sandboxes each way in the real run, 3 crun edges vs all-in-one (0: skip)',
      default: 60,
      min: 0,
    },
    {
      key: 'hold',
      long: 'hold',
      description: `sandboxes to hold on the simulated edges, then measure reads (issue 31: ${400_000}; needs --edges ≥ 100; 0: skip)`,
      default: 0,
      min: 0,
    },
    { key: 'realConcurrency', long: 'real-concurrency', description: 'sandboxes in flight in the real run', default: 8, min: 1 },
    {
      key: 'store',
      long: 'store',
      description:
        "the simulated edges' control plane's state store: a postgres:// URL of an empty database (default: SQLite in its data dir)",
      default: '',
      min: 0,
      text: true,
    },
  ],
  maxSandboxes: (o) => o.realCount + 10,
  run: runCluster,
  targets: clusterTargets,
  render: renderCluster,
  lines: clusterLines,
  headline: clusterHeadline,
};
