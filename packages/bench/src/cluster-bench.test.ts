/** `dsec bench cluster`'s parts that need no root: the simulated edge over the edge protocol, the targets, the rendering. */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import { ApiError, HttpEdgeClient, type App, type EdgeCreateRequest, EDGE_PREFIX, serveSimulatedEdge, SimulatedEdge } from 'dsec/cluster';
import type { HostInfo } from './host-info.js';
import type { LatencySummary } from './latency.js';
import type { BenchReport } from './result-types.js';
import { clusterScenario } from './scenarios/cluster.js';
import { machineCeiling } from './scenarios/cluster-report.js';
import { type ClusterResult, type RealSide } from './scenarios/cluster-result.js';
import { SCENARIOS } from './scenarios/index.js';

const TOKEN = 'cluster-token-for-the-simulated-edge-test';
const req = (n: number): EdgeCreateRequest => ({
  id: `sb-simu-${String(n).padStart(13, '0')}`,
  layers: [`sha256:${'a'.repeat(64)}`],
  config: { env: [], cwd: '/', user: '0:0', entrypoint: [], cmd: ['sh'], labels: {} },
  env: {},
  limits: { cpu: 0.5, memoryMiB: 64, pids: 128 },
});

describe('simulated edge over the edge protocol', () => {
  const edge = new SimulatedEdge('simu', { cpus: 8, memoryBytes: 8 * 1024 ** 3, maxSandboxes: 3 });
  let server: App;
  let client: HttpEdgeClient;
  let url: string;
  before(async () => {
    ({ url, server } = await serveSimulatedEdge(edge, { token: TOKEN, log: pino({ level: 'silent' }) }));
    client = new HttpEdgeClient('simu', url, TOKEN);
  });
  after(async () => server.close());

  test('create, list, info and kill work through HttpEdgeClient; info counts what it holds', async () => {
    const sb = await client.createSandbox(req(1));
    assert.equal(sb.status, 'running');
    await client.createSandbox(req(2));
    assert.deepEqual((await client.listSandboxes()).map((s) => s.id).sort(), [req(1).id, req(2).id]);
    const info = await client.info();
    assert.equal(info.version, 'simulated');
    assert.equal(info.sandboxes, 2);
    assert.equal(info.capacity.cpuCommitted, 1);
    assert.equal(info.capacity.memoryCommittedMiB, 128);
    assert.deepEqual(info.cachedLayers, [req(1).layers[0]]);
    assert.ok(info.capacity.memoryAvailableBytes < info.capacity.memoryBytes);
    await client.killSandbox(req(2).id);
    assert.deepEqual(
      (await client.listSandboxes()).map((s) => s.id),
      [req(1).id],
    );
  });

  test('admission: beyond its maximum it refuses with CAPACITY_EXCEEDED, as a real edge does', async () => {
    await client.createSandbox(req(3));
    await client.createSandbox(req(4));
    await assert.rejects(client.createSandbox(req(5)), (err: unknown) => err instanceof ApiError && err.code === 'CAPACITY_EXCEEDED');
  });

  test('what it does not simulate answers INVALID_REQUEST naming it a simulated edge', async () => {
    await assert.rejects(
      client.exec(req(1).id, { cmd: ['true'] } as never),
      (err: unknown) => err instanceof ApiError && err.code === 'INVALID_REQUEST' && /simulated edge/.test(err.message),
    );
    await assert.rejects(
      client.readFile(req(1).id, '/etc/hostname', 100),
      (err: unknown) => err instanceof ApiError && /simulated edge/.test(err.message),
    );
  });

  test('a body that breaks the protocol schema is a 400, and a caller without the cluster token a 401', async () => {
    const bad = await fetch(`${url}${EDGE_PREFIX}/sandboxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ id: 'nope' }),
    });
    assert.equal(bad.status, 400);
    const anon = await fetch(`${url}${EDGE_PREFIX}/info`);
    assert.equal(anon.status, 401);
  });
});

const lat = (p50: number): LatencySummary => ({ count: 100, p50, p90: p50 * 2, p99: p50 * 3, min: 1, max: p50 * 4, mean: p50 });

function report(result: ClusterResult, options: Record<string, unknown>): BenchReport<ClusterResult> {
  const host: HostInfo = {
    hostname: 'h',
    os: 'Debian 12',
    kernel: '6.18',
    cpus: 2,
    cpuModel: 'cpu',
    memTotalMiB: 24000,
    node: 'v20',
    dsec: '0.1.0',
    loadAverage1m: 1,
    commandLine: 'dsec bench cluster',
  };
  return {
    scenario: 'cluster',
    startedAt: '2026-11-30T17:00:00.000Z',
    finishedAt: '2026-11-30T17:01:00.000Z',
    host,
    loadAverage1mAtEnd: 1,
    options,
    unavailable: [],
    targets: clusterScenario.targets(result),
    profile: [],
    notInstrumented: [],
    cleanup: { errors: [], leaks: [] },
    result,
  };
}

function result(over: Partial<ClusterResult> = {}): ClusterResult {
  return {
    peers: [{ name: 'dsec', description: 'd', version: 'v', errors: [] }],
    dropped: [],
    layout: 'three processes',
    edges: ['e1', 'e2', 'e3'],
    rate: {
      clients: 64,
      creates: 5000,
      ok: 5000,
      errors: [],
      seconds: 2,
      createsPerSecond: 2500,
      latency: lat(25),
      perEdge: { e1: 1700, e2: 1650, e3: 1650 },
      cpu: [{ process: 'control plane (dsec control)', seconds: 2, usPerCreate: 400 }],
    },
    batch: {
      mode: 'individual-creates',
      note: 'no batch API',
      count: 2000,
      placed: 2000,
      failed: 0,
      errors: [],
      acceptedSeconds: 0,
      placedSeconds: 1,
      runningSeconds: 1,
      placedPerSecond: 2000,
      perEdge: { e1: 700, e2: 650, e3: 650 },
      spreadPct: 7.69,
      readLatency: lat(5),
      createLatency: lat(30),
    },
    costs: { sqliteWritesUs: 100, edgeCallUs: 300, serialCreateUs: 1500 },
    edgeHeld: [
      { id: 'e1', sandboxes: 2400, created: 2400 },
      { id: 'e2', sandboxes: 2300, created: 2300 },
      { id: 'e3', sandboxes: 2300, created: 2300 },
    ],
    acceptedTotal: 7000,
    real: { unavailable: 'skipped (--real-count 0)' },
    ...over,
  };
}

describe('bench cluster targets and rendering', () => {
  test("the machine's ceiling: the processes' CPU per create together, against what the target allows on the host's cores", () => {
    const line = machineCeiling([{ usPerCreate: 300 }, { usPerCreate: 100 }, { usPerCreate: 100 }], 2, 'create', 5000, '5000 creates/s');
    assert.match(line, /spent 500 µs of CPU per create: 2 cores running only them would top out near 4000 creates\/s/);
    assert.match(line, /5000 creates\/s needs them at 400 µs per create or less/);
    assert.match(
      machineCeiling([{ usPerCreate: 150 }], 2, 'sandbox', 16000, '32000 in 2 s'),
      /near 13333 sandboxes\/s\. 32000 in 2 s needs them at 125 µs/,
    );
    assert.equal(machineCeiling([], 2, 'create', 5000, 'x'), '', 'nothing measured: no line');
  });
  test('registered; rate, batch (as a rate below 32,000) and spread are judged', () => {
    assert.ok(SCENARIOS.includes(clusterScenario as never));
    const [rate, batch, spread] = clusterScenario.targets(result());
    assert.equal(rate!.ok, false);
    assert.match(rate!.note, /missed by 2500 creates\/s/);
    assert.equal(batch!.ok, false, '2000/s is short of 16000/s');
    assert.match(batch!.measured, /32000 would take 16 s/);
    assert.equal(spread!.ok, true);
    const full = clusterScenario.targets(
      result({ batch: { ...result().batch, count: 32000, placed: 32000, placedSeconds: 1.9, placedPerSecond: 16842, spreadPct: 12 } }),
    );
    assert.equal(full[1]!.ok, true);
    const slow = clusterScenario.targets(
      result({ batch: { ...result().batch, count: 32000, placed: 32000, placedSeconds: 4.2, placedPerSecond: 7619 } }),
    );
    assert.equal(slow[1]!.ok, false, "4.2 s is over issue 31's 2 s");
    assert.equal(full[2]!.ok, false);
  });

  test('the markdown has every phase, the accounting check, the real run or why not, and the command; the chart is one SVG', () => {
    const { markdown, svg } = clusterScenario.render(report(result(), { edges: 3 }), 'x.svg');
    assert.match(markdown, /# dsec bench cluster/);
    assert.match(markdown, /\*\*simulated\*\* edges/);
    assert.match(markdown, /\| creates\/s \(5000 creates, 64 concurrent clients\) \| 2500 \|/);
    assert.match(markdown, /7000 \/ 7000 \(all there\)/);
    assert.match(markdown, /Not run: skipped/);
    assert.match(markdown, /`dsec bench cluster`/);
    assert.match(markdown, /near 2500 creates\/s/);
    assert.match(svg, /^<svg /);
    const real = { count: 60, concurrency: 8, allInOne: side(20), cluster: side(30) };
    const withReal = clusterScenario.render(report(result({ real, acceptedTotal: 6999 }), {}), 'x.svg').markdown;
    assert.match(withReal, /\| create p50 \(ms\) \| 20 \| 30 \| 1\.50× \|/);
    assert.match(withReal, /MISMATCH/);
    assert.equal(clusterScenario.lines(result()).length, 4);
  });

  test("the warm-up's rate and the control plane's event-loop share are shown when measured, and left out when not", () => {
    const measured = result();
    measured.rate = {
      ...measured.rate,
      controlLoopBusy: 0.96,
      warmup: { creates: 5000, ok: 5000, seconds: 2.5, createsPerSecond: 2000 },
    };
    measured.batch = { ...measured.batch, controlLoopBusy: 0.85 };
    const md = clusterScenario.render(report(measured, {}), 'x.svg').markdown;
    assert.match(md, /event loop busy in the rate phase \(its one thread; 1 = saturated\) \| 0\.96 \|/);
    assert.match(md, /event loop busy in the batch \| 0\.85 \|/);
    assert.match(md, /warm-up just before \(5000 creates, a fresh control plane's first\) \| 2000 \|/);
    const lines = clusterScenario.lines(measured).join('\n');
    assert.match(lines, /warm-up before it 5000 at 2000\/s/);
    assert.match(lines, /its event loop 96 % busy/);
    const plain = clusterScenario.render(report(result(), {}), 'x.svg').markdown;
    assert.doesNotMatch(plain, /event loop busy|warm-up just before/);
    assert.doesNotMatch(clusterScenario.lines(result()).join('\n'), /warm-up|event loop/);
  });
});

function side(p50: number): RealSide {
  return {
    description: 'd',
    completed: 60,
    seconds: 3,
    perSecond: 20,
    create: lat(p50),
    createExec: lat(p50 + 10),
    perEdge: { a: 20, b: 20, c: 20 },
    errors: [],
  };
}
