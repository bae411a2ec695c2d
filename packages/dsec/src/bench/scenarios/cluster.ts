import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { round } from '../../demo/stats.js';
import { HttpEdgeClient } from '../../control/edges/http-edge-client.js';
import { StateStore } from '../../control/state-store.js';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { startControlChild, startEdgeChild, startSimulatedEdgesChild, waitForEdges, type BenchChild } from '../cluster-processes.js';
import { BENCH_IMAGE } from '../fixture.js';
import { HttpLoadClient } from '../http-load.js';
import { summarizeLatency, type LatencySummary } from '../latency.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { BENCH_LIMITS } from '../peers/setup.js';
import { pool } from '../rounds.js';
import { serveSimulatedEdge, SimulatedEdge } from '../simulated-edge.js';
import type { EdgeCreateRequest } from '../../edge/protocol/edge-api.js';
import { renderCluster, clusterTargets, clusterLines, clusterHeadline } from './cluster-report.js';
import type { BenchScenarioDef, PeerResultBase, ScenarioContext, ScenarioResult } from './scenario.js';

export interface ClusterOptions {
  /** Simulated edges joined to the control plane. @default 3 */
  edges: number;
  /** Concurrent clients creating sandboxes (keep-alive HTTP, one request in flight each). @default 64 */
  clients: number;
  /** Creates in the rate phase. @default 5000 */
  creates: number;
  /** Sandboxes in the batch phase (32000: the job size). @default 2000 */
  batchCount: number;
  /** The batch's creates in flight (its `concurrency`). @default 64 */
  batchConcurrency: number;
  /** Sandboxes each way in the real run (three crun edges vs the all-in-one); 0 skips it. @default 60 */
  realCount: number;
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
  count: number;
  concurrency: number;
  allInOne: RealSide;
  cluster: RealSide;
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
  /** Accepted by the API in both phases (placed): must equal the sum of edgeHeld. */
  acceptedTotal: number;
  real: RealRun | { unavailable: string };
}

const LAYOUT =
  'three processes: the control plane (`dsec control`, a child process), the simulated edges (one child process for all of them), ' +
  'and the load generator (the benchmark process). Apart, so the control plane does not share its event loop with the edges or the clients; ' +
  'together on the same 2 cores, so every CPU-second the edges and clients spend is one the control plane does not get.';

const SPEC = { image: BENCH_IMAGE, resources: { memoryMiB: 64, cpu: 0.1 } };
const MAX_ERRORS = 5;

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

interface BatchEvent {
  seq: number;
  type: 'accepted' | 'placed' | 'running' | 'failed' | 'done' | 'cancelled';
  index?: number;
  code?: string;
  sandboxId?: string;
  edge?: string;
  reason?: string;
}

/** POST /v1/batches, then its events (NDJSON, resumed after the last seq on a reconnect) until `done`. */
async function runBatchApi(
  url: string,
  apiKey: string,
  count: number,
  concurrency: number,
  signal: AbortSignal,
): Promise<Omit<BatchPhase, 'readLatency' | 'createLatency' | 'spreadPct' | 'note' | 'mode'> | undefined> {
  const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/batches`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ count, spec: SPEC, concurrency }),
    signal,
  });
  if (res.status === 404) {
    const body = (await res.json().catch(() => ({}))) as { error?: { code?: string } };
    if (body.error?.code === 'ROUTE_NOT_FOUND') return undefined;
    throw new Error(`POST /v1/batches: HTTP 404 ${JSON.stringify(body)}`);
  }
  if (res.status !== 202) throw new Error(`POST /v1/batches: HTTP ${res.status} ${await res.text()}`);
  const acceptedSeconds = (performance.now() - t0) / 1000;
  const { id } = (await res.json()) as { id: string };
  const perEdge: PerEdge = {};
  const errors: string[] = [];
  const placed = new Set<number>();
  const running = new Set<number>();
  const failed = new Set<number>();
  let lastSeq = -1;
  let placedAt = NaN;
  let runningAt = NaN;
  let done = false;
  while (!done) {
    signal.throwIfAborted();
    const ev = await fetch(`${url}/v1/batches/${id}/events?after=${lastSeq}`, {
      headers: { authorization: headers.authorization },
      signal,
    });
    if (!ev.ok || !ev.body) throw new Error(`GET /v1/batches/${id}/events: HTTP ${ev.status} ${await ev.text()}`);
    let buf = '';
    const decoder = new TextDecoder();
    for await (const chunk of ev.body) {
      buf += decoder.decode(chunk as Uint8Array, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        const e = JSON.parse(line) as BatchEvent;
        if (e.seq <= lastSeq) continue;
        lastSeq = e.seq;
        if (e.type === 'placed' && e.index !== undefined) placed.add(e.index);
        else if (e.type === 'running' && e.index !== undefined && !running.has(e.index)) {
          running.add(e.index);
          placed.add(e.index);
          if (e.edge) perEdge[e.edge] = (perEdge[e.edge] ?? 0) + 1;
        } else if (e.type === 'failed' && e.index !== undefined) {
          failed.add(e.index);
          if (errors.length < MAX_ERRORS) errors.push(`#${e.index}: ${e.code ?? ''} ${e.reason ?? 'failed'}`);
        } else if (e.type === 'done' || e.type === 'cancelled') done = true;
        const now = performance.now();
        if (Number.isNaN(placedAt) && placed.size + failed.size >= count) placedAt = now;
        if (Number.isNaN(runningAt) && running.size + failed.size >= count) runningAt = now;
      }
    }
  }
  const end = performance.now();
  const placedSeconds = ((Number.isNaN(placedAt) ? end : placedAt) - t0) / 1000;
  const runningSeconds = ((Number.isNaN(runningAt) ? end : runningAt) - t0) / 1000;
  return {
    count,
    placed: running.size,
    failed: failed.size,
    errors,
    acceptedSeconds: round(acceptedSeconds, 3),
    placedSeconds: round(placedSeconds, 3),
    runningSeconds: round(runningSeconds, 3),
    placedPerSecond: round(placed.size / placedSeconds, 1),
    perEdge,
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
      await store.insertSandbox(info, undefined, SPEC); // with its spec, in one transaction, as ControlPlane.create writes it
      await store.setStatus(info.id, 'running');
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

/** One side of the real run: `count` sandboxes created and running `echo ok`, `concurrency` in flight, then removed. */
async function realSide(
  peer: DsecApiPeer | Peer,
  count: number,
  concurrency: number,
  description: string,
  signal: AbortSignal,
): Promise<RealSide> {
  const errors: string[] = [];
  const ids: string[] = [];
  const create: number[] = [];
  const createExec: number[] = [];
  const perEdge: PerEdge = {};
  const t0 = performance.now();
  await pool(count, concurrency, async () => {
    if (signal.aborted || errors.length >= 3) return;
    const t = performance.now();
    try {
      const id = await peer.create();
      create.push(performance.now() - t);
      ids.push(id);
      const edge = /^sb-([a-z0-9]+)-/.exec(id)?.[1] ?? '?';
      perEdge[edge] = (perEdge[edge] ?? 0) + 1;
      const out = await peer.exec(id, ['echo', 'ok']);
      if (out.trim() !== 'ok') throw new Error(`echo ok printed ${JSON.stringify(out)}`);
      createExec.push(performance.now() - t);
    } catch (err) {
      errors.push((err as Error).message);
    }
  });
  const seconds = (performance.now() - t0) / 1000;
  await pool(ids.length, concurrency, async (i) => {
    await peer.remove(ids[i]!).catch((err: unknown) => void errors.push(`remove: ${(err as Error).message}`));
  });
  signal.throwIfAborted();
  return {
    description,
    completed: createExec.length,
    seconds: round(seconds, 2),
    perSecond: round(createExec.length / seconds, 1),
    create: summarizeLatency(create),
    createExec: summarizeLatency(createExec),
    perEdge,
    errors,
  };
}

/** Three `dsec edge` daemons (real crun) under a `dsec control`, side by side with the all-in-one dsec of the run. */
async function runReal(peers: Peer[], opts: ClusterOptions, ctx: ScenarioContext): Promise<RealRun | { unavailable: string }> {
  const { names, say, signal } = ctx;
  const aio = peers.find((p) => p.name === 'dsec');
  if (!aio) return { unavailable: 'the all-in-one dsec peer did not start' };
  const dir = join(names.dir, 'cluster-real');
  mkdirSync(dir, { recursive: true });
  const children: BenchChild[] = [];
  let control: Awaited<ReturnType<typeof startControlChild>> | undefined;
  let peer: DsecApiPeer | undefined;
  try {
    say(`real run: dsec control + 3 dsec edge daemons (crun) on loopback, each with its own data dir under ${dir}…`);
    control = await startControlChild(join(dir, 'control'));
    const ids = [1, 2, 3].map((k) => `${names.edgeId}r${k}`);
    for (const [k, id] of ids.entries()) {
      const e = await startEdgeChild({
        join: control.url,
        token: control.joinToken,
        id,
        dataDir: join(dir, `edge${k + 1}`),
        maxSandboxes: Math.max(100, opts.realCount * 2),
      });
      children.push(e.child);
    }
    await waitForEdges(control.url, control.apiKey, ids);
    peer = new DsecApiPeer(
      { url: control.url, apiKey: control.apiKey },
      BENCH_IMAGE,
      BENCH_LIMITS,
      { bench: names.id },
      aio.version,
      `sb-${names.edgeId}r`,
    );
    // Warm-up: each edge fetches the busybox layer from the control plane's blob endpoint once.
    say('  warm-up (each edge fetches the busybox layer once)…');
    await realSide(peer, 6, 6, 'warm-up', signal);
    say(`  all-in-one: ${opts.realCount} sandboxes + echo ok, ${opts.realConcurrency} in flight…`);
    const allInOne = await realSide(
      aio,
      opts.realCount,
      opts.realConcurrency,
      `dsec up (all-in-one, in-process edge): ${aio.description}`,
      signal,
    );
    say(`  cluster: ${opts.realCount} sandboxes + echo ok, ${opts.realConcurrency} in flight…`);
    const cluster = await realSide(
      peer,
      opts.realCount,
      opts.realConcurrency,
      'dsec control + 3 × dsec edge (child processes, loopback HTTP edge protocol, crun), same SDK calls',
      signal,
    );
    return { count: opts.realCount, concurrency: opts.realConcurrency, allInOne, cluster };
  } catch (err) {
    if (signal.aborted) throw err;
    say(`real run failed: ${(err as Error).message}`);
    return { unavailable: `the real run failed: ${(err as Error).message}` };
  } finally {
    await peer?.close().catch(() => undefined);
    for (const c of children.reverse()) await c.stop();
    await control?.child.stop();
  }
}

export async function runCluster(peers: Peer[], opts: ClusterOptions, ctx: ScenarioContext): Promise<ClusterResult> {
  const { names, say, signal } = ctx;
  const dir = join(names.dir, 'cluster');
  mkdirSync(dir, { recursive: true });
  const dropped: PeerUnavailable[] = [];
  say(`control plane: dsec control in a child process (${join(dir, 'control')}), busybox built through its API…`);
  const control = await startControlChild(join(dir, 'control'));
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
    accepted += (await createMany(http, Math.min(1000, opts.creates), opts.clients, signal)).ok; // warm-up (JIT, sockets)
    const pids = { control: control.child.proc.pid!, edges: edges.child.proc.pid! };
    const cpu0 = { control: cpuSeconds(pids.control), edges: cpuSeconds(pids.edges), self: selfCpuSeconds() };
    const t0 = performance.now();
    const a = await createMany(http, opts.creates, opts.clients, signal);
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = { control: cpuSeconds(pids.control), edges: cpuSeconds(pids.edges), self: selfCpuSeconds() };
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
    };
    say(`  ${a.ok} in ${round(seconds, 2)} s = ${rate.createsPerSecond}/s, p50 ${rate.latency.p50} ms`);

    say(`batch: ${opts.batchCount} sandboxes from accepted to all placed…`);
    const probed = probe(http, '/v1/nodes');
    let batch: BatchPhase;
    const viaApi = await runBatchApi(control.url, control.apiKey, opts.batchCount, opts.batchConcurrency, signal);
    if (viaApi) {
      const readLatency = summarizeLatency(await probed.stop());
      batch = {
        mode: 'batch-api',
        note: `one POST /v1/batches {count: ${opts.batchCount}, concurrency: ${opts.batchConcurrency}}; times from its NDJSON events`,
        ...viaApi,
        spreadPct: spreadPct(viaApi.perEdge, edgeIds),
        readLatency,
        createLatency: summarizeLatency([]),
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
    return { peers: [peerBase], dropped, layout: LAYOUT, edges: edgeIds, rate, batch, costs, edgeHeld, acceptedTotal: accepted, real };
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
    { key: 'batchCount', long: 'batch-count', description: "sandboxes in the batch (32000: the issue's job)", default: 2000, min: 1 },
    {
      key: 'batchConcurrency',
      long: 'batch-concurrency',
      description: "the batch's creates in flight (its concurrency)",
      default: 64,
      min: 1,
    },
    {
      key: 'realCount',
      long: 'real-count',
      description: 'sandboxes each way in the real run, 3 crun edges vs all-in-one (0: skip)',
      default: 60,
      min: 0,
    },
    { key: 'realConcurrency', long: 'real-concurrency', description: 'sandboxes in flight in the real run', default: 8, min: 1 },
  ],
  maxSandboxes: (o) => o.realCount + 10,
  run: runCluster,
  targets: clusterTargets,
  render: renderCluster,
  lines: clusterLines,
  headline: clusterHeadline,
};
