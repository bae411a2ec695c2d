/**
 * Benchmark (not a test): creates/s and API p50 through control-plane replicas, in one run. Each
 * control plane is a process of its own (test/cluster/support/replica-process.ts); PostgreSQL is
 * the test harness's (initdb in a temp dir). Run as root:
 *   node packages/dsec/dist/test/bench/replicas.js [creates=2000] [concurrency=32]
 *     two simulated edges (the edge protocol over HTTP, no crun): one replica on SQLite, one on
 *     PostgreSQL, two on PostgreSQL, each setup run twice (ABC CBA); writes
 *     bench/results/replicas-<time>.json and .md.
 *   node packages/dsec/dist/test/bench/replicas.js [creates=100] [concurrency=8] real
 *     two real edges (`dsec edge` daemons in this process: crun, EROFS, overlayfs) joined to every
 *     replica: one replica on SQLite, one on PostgreSQL, two on PostgreSQL, replicas sharing one
 *     layer dir, each setup run twice (ABC CBA); sandboxes are killed after each setup; the load
 *     average is recorded around each setup; writes bench/results/replicas-real-<time>.json and .md.
 *   node packages/dsec/dist/test/bench/replicas.js [creates=2000] [concurrency=32] control
 *     as the first, with a fourth setup: two independent replicas (each on a database of its own,
 *     with two simulated edges of its own), each given half the load. They share nothing, so what
 *     they spend per create above one replica is what splitting the load over two processes costs
 *     on this machine, not what replicas do to work together; writes replicas-control-<time>.
 *   --warmup=N (anywhere after the script): creates each replica makes before the measured ones,
 *     not measured (default: `creates` with simulated edges, 0 with real ones). A fresh process's
 *     first thousands of creates run through code V8 has not compiled yet, and a process pays that
 *     once: measured cold, two replicas given half the creates each paid it twice for the same
 *     work, and that, not sharing a store, was most of what two replicas spent per create above
 *     one (the tenth stop's runs, docs/BENCHMARKS.md).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { startSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { startEdgeDaemon } from '../../src/runtime/edge-daemon.js';
import { testPostgres } from '../helpers/postgres.js';
import { makeDataDir, newEdgeId } from '../helpers/server.js';

const flags = process.argv.slice(2).filter((a) => a.startsWith('--'));
const args = process.argv.slice(2).filter((a) => !a.startsWith('--'));
const real = args[2] === 'real';
const control = args[2] === 'control';
const creates = Number(args[0] ?? (real ? 100 : 2000));
const concurrency = Number(args[1] ?? (real ? 8 : 32));
const warmupFlag = flags.find((f) => f.startsWith('--warmup='));
/** Creates each replica makes before the measured ones (see the opening comment). */
const warmup = warmupFlag ? Number(warmupFlag.slice('--warmup='.length)) : real ? 0 : creates;
if (!Number.isInteger(warmup) || warmup < 0) throw new Error(`--warmup=N: a whole number of creates per replica, got ${warmupFlag}`);
/** Replicas of one run share this layer dir (as replicas on a shared mount would). */
const layerDir = makeDataDir();
const here = fileURLToPath(new URL('.', import.meta.url));
const replicaScript = join(here, '..', 'cluster', 'support', 'replica-process.js');

/** Node options for the replicas only, e.g. `DSEC_BENCH_CHILD_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof'` (as `dsec bench cluster`). */
const childNodeArgs = (process.env['DSEC_BENCH_CHILD_NODE_ARGS'] ?? '').split(/\s+/).filter(Boolean);

interface Replica {
  url: string;
  apiKey: string;
  joinToken: string;
  child: ChildProcess;
  dataDir: string;
  /** Replicas of one cluster share their edges; the control setup has two clusters. @default 0 */
  cluster?: number;
}

async function startReplica(store: string): Promise<Replica> {
  const dataDir = makeDataDir();
  const child = spawn(process.execPath, [...childNodeArgs, replicaScript, JSON.stringify({ dataDir, store, layerDir })], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  // The line with its URL; a log line may come first (at level warn, doctor says what it fixed on the host).
  const line = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on('line', (l) => {
      if (l.startsWith('{"url":')) resolve(l);
    });
    child.once('exit', (code) => reject(new Error(`replica exited (${code})`)));
  });
  return { ...(JSON.parse(line) as { url: string; apiKey: string; joinToken: string }), child, dataDir };
}

/**
 * Keep-alive HTTP to each replica, as `dsec bench cluster`'s load generator: undici's Pool, since
 * the load generator shares this machine's 2 cores with the replicas it measures and fetch spends
 * several times the Pool's CPU per request.
 */
const pools = new Map<string, Pool>();

async function call(
  r: Replica,
  method: 'GET' | 'POST' | 'DELETE',
  path: string,
  body?: unknown,
): Promise<{ status: number; text: string }> {
  let pool = pools.get(r.url);
  if (!pool) pools.set(r.url, (pool = new Pool(r.url, { connections: concurrency })));
  const headers: Record<string, string> = { authorization: `Bearer ${r.apiKey}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await pool.request({ method, path, headers, body: body === undefined ? null : JSON.stringify(body) });
  return { status: res.statusCode, text: await res.body.text() };
}

async function stopReplica(r: Replica): Promise<void> {
  await pools.get(r.url)?.close();
  pools.delete(r.url);
  r.child.kill('SIGTERM');
  await new Promise((res) => r.child.once('exit', res));
  rmSync(r.dataDir, { recursive: true, force: true });
}

function percentile(sorted: number[], p: number): number {
  return Math.round(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]! * 100) / 100;
}

/** `n` requests at `concurrency`, the i-th to replicas[i % replicas.length]; wall time and per-request latencies. */
async function load(
  replicas: Replica[],
  n: number,
  request: (r: Replica, i: number) => Promise<void>,
): Promise<{ seconds: number; ms: number[] }> {
  const ms: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const t = performance.now();
        await request(replicas[i % replicas.length]!, i);
        ms.push(performance.now() - t);
      }
    }),
  );
  return { seconds: (performance.now() - t0) / 1000, ms: ms.sort((a, b) => a - b) };
}

/** Two edges joined to every replica of each cluster: simulated, or real `dsec edge` daemons. */
async function startEdges(replicas: Replica[], label: string): Promise<{ close(): Promise<void> }[]> {
  const out: { close(): Promise<void> }[] = [];
  for (const cluster of new Set(replicas.map((r) => r.cluster ?? 0))) {
    const members = replicas.filter((r) => (r.cluster ?? 0) === cluster);
    out.push(...(await startClusterEdges(members, `${label.length}${cluster || ''}`)));
  }
  return out;
}

async function startClusterEdges(replicas: Replica[], suffix: string): Promise<{ close(): Promise<void> }[]> {
  const join = replicas.map((r) => r.url).join(',');
  const token = replicas[0]!.joinToken;
  const out: { close(): Promise<void> }[] = [];
  for (const id of ['benchone', 'benchtwo']) {
    if (!real) {
      out.push(await startSimulatedEdge({ join, token, id: `${id}${suffix}` }));
      continue;
    }
    const dataDir = makeDataDir();
    const daemon = await startEdgeDaemon({
      join,
      token,
      listen: '127.0.0.1:0',
      dataDir,
      id: newEdgeId(),
      pool: 'default',
      labels: {},
      cpuOvercommit: 0,
      maxSandboxes: creates + 16,
      layerCacheMiB: 1024,
      logLevel: 'warn',
    });
    out.push({
      async close() {
        await daemon.close({ killAll: true });
        rmSync(dataDir, { recursive: true, force: true });
      },
    });
  }
  return out;
}

/** CPU time (user + system) process `pid` has used, in ms (/proc/PID/stat; 100 clock ticks a second). */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // from field 3 (state) on
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** The CPU the replicas' processes used together, in ms. */
function replicasCpuMs(replicas: Replica[]): number {
  return replicas.reduce((t, r) => t + cpuMs(r.child.pid!), 0);
}

/** How long the replicas' idle CPU is sampled before each setup's load (ms). */
const IDLE_SAMPLE_MS = 3000;

/** The 1-minute load average, to 2 places. */
function load1(): number {
  return Math.round(loadavg()[0]! * 100) / 100;
}

async function measure(label: string, replicas: Replica[]): Promise<Record<string, number | string>> {
  const loadBefore = load1();
  const edges = await startEdges(replicas, label);
  try {
    // Every replica sees both edges (of its cluster) before the load starts.
    for (const r of replicas) {
      for (;;) {
        const res = await call(r, 'GET', '/v1/nodes');
        // Edges of an earlier setup on the same store are lost by now, or soon: not counted.
        if ((JSON.parse(res.text) as { nodes: { state: string }[] }).nodes.filter((n) => n.state === 'ready').length === 2) break;
        await new Promise((res2) => setTimeout(res2, 100));
      }
    }
    const create = async (r: Replica): Promise<string> => {
      const res = await call(r, 'POST', '/v1/sandboxes', { image: 'busybox', resources: { memoryMiB: 16 } });
      if (res.status !== 201) throw new Error(`create: HTTP ${res.status} ${res.text}`);
      return (JSON.parse(res.text) as { id: string }).id;
    };
    // Each replica makes `warmup` creates first, not measured (round-robin: the same number each).
    // Their sandboxes stay: simulated ones hold nothing; real ones are killed with the rest below.
    const warmIds: string[] = [];
    if (warmup > 0)
      await load(replicas, warmup * replicas.length, async (r) => {
        warmIds.push(await create(r));
      });
    // What the replicas spend with nothing asked of them (heartbeats, lease renewals, sweeps): a
    // cost per second, not per create, that a short run puts on each create.
    const idleFrom = replicasCpuMs(replicas);
    await new Promise((res) => setTimeout(res, IDLE_SAMPLE_MS));
    const idleCpuMsPerSecond = Math.round(((replicasCpuMs(replicas) - idleFrom) * 1000) / IDLE_SAMPLE_MS);
    const ids: string[] = [];
    /** The cluster each sandbox was made in: the control setup's two clusters know only their own. */
    const madeIn = new Map<string, Replica>();
    const cpuBefore = replicasCpuMs(replicas);
    const made = await load(replicas, creates, async (r) => {
      const id = await create(r);
      ids.push(id);
      madeIn.set(id, r);
    });
    const cpuUsPerCreate = Math.round(((replicasCpuMs(replicas) - cpuBefore) * 1000) / creates);
    const read = await load(replicas, creates, async (r, i) => {
      const id = ids[i % ids.length]!;
      const by = madeIn.get(id)!;
      // Any replica of the sandbox's cluster answers (round-robin, as the creates were).
      const at = (by.cluster ?? 0) === (r.cluster ?? 0) ? r : by;
      const res = await call(at, 'GET', `/v1/sandboxes/${id}`);
      if (res.status !== 200) throw new Error(`inspect: HTTP ${res.status}`);
    });
    if (real) {
      // Real sandboxes hold mounts and cgroups: killed before the next setup (not timed).
      const all = [...warmIds, ...ids];
      await load(replicas, all.length, async (r, i) => {
        const res = await call(r, 'DELETE', `/v1/sandboxes/${all[i]}`);
        if (res.status !== 204) throw new Error(`kill: HTTP ${res.status}`);
      });
    }
    return {
      setup: label,
      creates,
      warmupPerReplica: warmup,
      concurrency,
      createsPerSecond: Math.round((creates / made.seconds) * 100) / 100,
      createP50Ms: percentile(made.ms, 50),
      createP99Ms: percentile(made.ms, 99),
      cpuUsPerCreate,
      idleCpuMsPerSecond,
      inspectP50Ms: percentile(read.ms, 50),
      inspectP99Ms: percentile(read.ms, 99),
      loadBefore,
      loadAfter: load1(),
    };
  } finally {
    for (const e of edges) await e.close();
  }
}

const results: Record<string, number | string>[] = [];
const pg = await testPostgres();
/**
 * The setups, in order; each is run twice, forward then backward (ABC CBA), so a load that drifts
 * through the run weighs on each alike (this machine is shared: one round each once put a 1.24×
 * and a 1.48× CPU ratio on the same code in consecutive runs).
 */
const suffix = real ? ', real edges' : '';
const setups: { label: string; start(): Promise<Replica[]> }[] = [
  { label: `1 replica, SQLite${suffix}`, start: async () => [await startReplica('')] },
  // A database per setup: a replica started later would still count an earlier setup's edges as
  // ready (their rows say so until the watcher's replica marks them lost; see the issue's report).
  {
    label: `1 replica, PostgreSQL${suffix}`,
    start: async () => [await startReplica(await pg.database(`dsec_bench_one_${Date.now()}`))],
  },
  {
    label: `2 replicas, PostgreSQL${suffix}`,
    start: async () => {
      const store = await pg.database(`dsec_bench_two_${Date.now()}`);
      return [await startReplica(store), await startReplica(store)];
    },
  },
];
/** The control setup's label (see the file's opening comment). */
const INDEPENDENT = '2 independent replicas, PostgreSQL (a database and edges each)';
if (control && !real)
  setups.push({
    label: INDEPENDENT,
    start: async () => [
      await startReplica(await pg.database(`dsec_bench_indep_a_${Date.now()}`)),
      { ...(await startReplica(await pg.database(`dsec_bench_indep_b_${Date.now()}`))), cluster: 1 },
    ],
  });
for (const [round, order] of [setups, [...setups].reverse()].entries()) {
  for (const setup of order) {
    const replicas = await setup.start();
    try {
      results.push({ ...(await measure(setup.label, replicas)), round: round + 1 });
    } finally {
      for (const r of replicas) await stopReplica(r);
    }
  }
}
rmSync(layerDir, { recursive: true, force: true });
const stamp = new Date()
  .toISOString()
  .replace(/[-:]/g, '')
  .replace(/\.\d+Z$/, 'Z');
const command = `node packages/dsec/dist/test/bench/replicas.js ${creates} ${concurrency}${real ? ' real' : control ? ' control' : ''}${warmupFlag ? ` ${warmupFlag}` : ''}`;
const dir = join(here, '..', '..', '..', '..', '..', 'bench', 'results');
mkdirSync(dir, { recursive: true });
const byLabel = (r: Record<string, number | string>): Record<string, number> => r as Record<string, number>;
const ratio = (x: Record<string, number | string>, y: Record<string, number | string>, what: string): string =>
  `creates/s ${(byLabel(x)['createsPerSecond']! / byLabel(y)['createsPerSecond']!).toFixed(2)}×, create p50 ${(byLabel(x)['createP50Ms']! / byLabel(y)['createP50Ms']!).toFixed(2)}×, inspect p50 ${(byLabel(x)['inspectP50Ms']! / byLabel(y)['inspectP50Ms']!).toFixed(2)}× (${what})`;
/** A setup with each number the mean of its two rounds. */
const mean = (label: string): Record<string, number | string> => {
  const rows = results.filter((r) => r['setup'] === label);
  const out: Record<string, number | string> = { setup: label };
  for (const k of ['createsPerSecond', 'createP50Ms', 'inspectP50Ms', 'cpuUsPerCreate'])
    out[k] = Math.round((rows.reduce((t, r) => t + Number(r[k]), 0) / rows.length) * 100) / 100;
  return out;
};
const summary = setups.map((x) => mean(x.label));
const first = summary[0]!;
/** Two replicas on one store: the third setup. */
const last = summary[2] ?? summary[summary.length - 1]!;
const independent = summary.find((r) => r['setup'] === INDEPENDENT);
const md = [
  real
    ? '# Control-plane replicas with real edges: 2 on PostgreSQL vs 1 on SQLite (and 1 on PostgreSQL)'
    : `# Control-plane replicas: 2 on PostgreSQL vs 1 on PostgreSQL and 1 on SQLite`,
  '',
  real
    ? `Command: \`${command}\` (${new Date().toISOString()}). Two real edges (\`dsec edge\` daemons in the benchmark's process: crun, EROFS, overlayfs; busybox sandboxes, 16 MiB); each control plane`
    : `Command: \`${command}\` (${new Date().toISOString()}). Two simulated edges (edge protocol over HTTP, no crun); each control plane`,
  'a process of its own; PostgreSQL 15 from the test harness (fsync off: a throw-away cluster); creates and inspects spread',
  'round-robin over the replicas; on a shared 2-core machine (noisy: read the ratios, not the absolute numbers).',
  '',
  'Each setup ran twice, forward then backward (ABC CBA), so a load that drifts through the run weighs on each alike.',
  warmup > 0
    ? `Each replica made ${warmup} creates first, not measured (a fresh process's first creates run through code V8 has not compiled yet, a cost each process pays once).`
    : 'No warm-up: each replica was measured from its first create.',
  '',
  '| setup | round | creates/s | create p50 ms | create p99 ms | control-plane CPU per create (µs, all replicas) | idle CPU (ms per s, all replicas) | inspect p50 ms | inspect p99 ms | load avg (1 min) before → after |',
  '|---|---|---|---|---|---|---|---|---|---|',
  ...results.map(
    (r) =>
      `| ${r['setup']} | ${r['round'] ?? 1} | ${r['createsPerSecond']} | ${r['createP50Ms']} | ${r['createP99Ms']} | ${r['cpuUsPerCreate']} | ${r['idleCpuMsPerSecond']} | ${r['inspectP50Ms']} | ${r['inspectP99Ms']} | ${r['loadBefore']} → ${r['loadAfter']} |`,
  ),
  '',
  'Means of the two rounds:',
  '',
  '| setup | creates/s | create p50 ms | inspect p50 ms | control-plane CPU per create (µs) |',
  '|---|---|---|---|---|',
  ...summary.map(
    (r) => `| ${r['setup']} | ${r['createsPerSecond']} | ${r['createP50Ms']} | ${r['inspectP50Ms']} | ${r['cpuUsPerCreate']} |`,
  ),
  '',
  `Ratios (of the means): ${ratio(last, first, `${last['setup']} ÷ ${first['setup']}`)}.`,
  ...(summary.length > 2
    ? [
        '',
        `Also: ${ratio(last, summary[1]!, `${last['setup']} ÷ ${summary[1]!['setup']}`)}; ${ratio(summary[1]!, first, `${summary[1]!['setup']} ÷ ${first['setup']}`)}.`,
      ]
    : []),
  ...(!real && summary.length > 2
    ? [
        '',
        // Issue 31: two replicas, each given half the load, spend no more CPU in all per create than one at full load (within 10 %).
        `Control-plane CPU per create, ${last['setup']} (all replicas together) ÷ ${summary[1]!['setup']}: ${(Number(last['cpuUsPerCreate']) / Number(summary[1]!['cpuUsPerCreate'])).toFixed(2)}× (issue 31's target: ≤ 1.10×).`,
      ]
    : []),
  ...(independent
    ? [
        '',
        // The control: replicas that share nothing, so their excess is the split's, not the sharing's.
        `Control: ${INDEPENDENT} ÷ ${summary[1]!['setup']}: ${(Number(independent['cpuUsPerCreate']) / Number(summary[1]!['cpuUsPerCreate'])).toFixed(2)}×; ${last['setup']} ÷ ${INDEPENDENT}: ${(Number(last['cpuUsPerCreate']) / Number(independent['cpuUsPerCreate'])).toFixed(2)}× (what sharing a store adds to splitting the load).`,
      ]
    : []),
  '',
].join('\n');
const base = real ? `replicas-real-${stamp}` : control ? `replicas-control-${stamp}` : `replicas-${stamp}`;
writeFileSync(join(dir, `${base}.json`), JSON.stringify({ command, results }, null, 2) + '\n');
writeFileSync(join(dir, `${base}.md`), md);
process.stdout.write(md);
process.exit(0);
