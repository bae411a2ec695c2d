/**
 * Benchmark (not a test): creates/s and API p50 through two control-plane replicas on PostgreSQL
 * vs one control plane on SQLite, in one run, against two simulated edges (the edge protocol over
 * HTTP, no crun). Each control plane is a process of its own (test/cluster/support/
 * replica-process.ts); PostgreSQL is the test harness's (initdb in a temp dir). Run as root:
 *   node packages/dsec/dist/test/bench/replicas.js [creates=2000] [concurrency=32]
 * Writes bench/results/replicas-<time>.json and .md.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/bench/simulated-edge.js';
import { testPostgres } from '../helpers/postgres.js';
import { makeDataDir } from '../helpers/server.js';

const creates = Number(process.argv[2] ?? 2000);
const concurrency = Number(process.argv[3] ?? 32);
const here = fileURLToPath(new URL('.', import.meta.url));
const replicaScript = join(here, '..', 'cluster', 'support', 'replica-process.js');

interface Replica {
  url: string;
  apiKey: string;
  joinToken: string;
  child: ChildProcess;
  dataDir: string;
}

async function startReplica(store: string): Promise<Replica> {
  const dataDir = makeDataDir();
  const child = spawn(process.execPath, [replicaScript, JSON.stringify({ dataDir, store })], { stdio: ['ignore', 'pipe', 'inherit'] });
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once('line', resolve);
    child.once('exit', (code) => reject(new Error(`replica exited (${code})`)));
  });
  return { ...(JSON.parse(line) as { url: string; apiKey: string; joinToken: string }), child, dataDir };
}

async function stopReplica(r: Replica): Promise<void> {
  r.child.kill('SIGTERM');
  await new Promise((res) => r.child.once('exit', res));
  rmSync(r.dataDir, { recursive: true, force: true });
}

function percentile(sorted: number[], p: number): number {
  return Math.round(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]! * 100) / 100;
}

/** `n` requests at `concurrency`, the i-th to replicas[i % replicas.length]; wall time and per-request latencies. */
async function load(replicas: Replica[], n: number, request: (r: Replica, i: number) => Promise<void>): Promise<{ seconds: number; ms: number[] }> {
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

async function measure(label: string, replicas: Replica[]): Promise<Record<string, number | string>> {
  const edges: RunningSimulatedEdge[] = [];
  for (const id of ['benchone', 'benchtwo']) {
    edges.push(await startSimulatedEdge({ join: replicas.map((r) => r.url).join(','), token: replicas[0]!.joinToken, id: `${id}${label.length}` }));
  }
  try {
    // Every replica sees both edges before the load starts.
    for (const r of replicas) {
      for (;;) {
        const res = await fetch(`${r.url}/v1/nodes`, { headers: { authorization: `Bearer ${r.apiKey}` } });
        if (((await res.json()) as { nodes: unknown[] }).nodes.length === 2) break;
        await new Promise((res2) => setTimeout(res2, 100));
      }
    }
    const ids: string[] = [];
    const made = await load(replicas, creates, async (r) => {
      const res = await fetch(`${r.url}/v1/sandboxes`, {
        method: 'POST',
        headers: { authorization: `Bearer ${r.apiKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ image: 'busybox', resources: { memoryMiB: 16 } }),
      });
      if (res.status !== 201) throw new Error(`create: HTTP ${res.status} ${await res.text()}`);
      ids.push(((await res.json()) as { id: string }).id);
    });
    const read = await load(replicas, creates, async (r, i) => {
      const res = await fetch(`${r.url}/v1/sandboxes/${ids[i % ids.length]}`, { headers: { authorization: `Bearer ${r.apiKey}` } });
      if (res.status !== 200) throw new Error(`inspect: HTTP ${res.status}`);
      await res.arrayBuffer();
    });
    return {
      setup: label,
      creates,
      concurrency,
      createsPerSecond: Math.round(creates / made.seconds),
      createP50Ms: percentile(made.ms, 50),
      createP99Ms: percentile(made.ms, 99),
      inspectP50Ms: percentile(read.ms, 50),
      inspectP99Ms: percentile(read.ms, 99),
    };
  } finally {
    for (const e of edges) await e.close();
  }
}

const results: Record<string, number | string>[] = [];
const sqlite = await startReplica('');
try {
  results.push(await measure('1 replica, SQLite', [sqlite]));
} finally {
  await stopReplica(sqlite);
}
const pg = await testPostgres();
const store = await pg.database(`dsec_bench_${Date.now()}`);
const first = await startReplica(store);
const second = await startReplica(store);
try {
  results.push(await measure('2 replicas, PostgreSQL', [first, second]));
} finally {
  await stopReplica(first);
  await stopReplica(second);
}
const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');
const command = `node packages/dsec/dist/test/bench/replicas.js ${creates} ${concurrency}`;
const dir = join(here, '..', '..', '..', '..', '..', 'bench', 'results');
mkdirSync(dir, { recursive: true });
const [a, b] = results as [Record<string, number>, Record<string, number>];
const md = [
  `# Control-plane replicas: 2 on PostgreSQL vs 1 on SQLite`,
  '',
  `Command: \`${command}\` (${new Date().toISOString()}). Two simulated edges (edge protocol over HTTP, no crun); each control plane`,
  'a process of its own; PostgreSQL 15 from the test harness (fsync off: a throw-away cluster); creates and inspects spread',
  'round-robin over the replicas; one run on a shared 2-core machine (noisy: read the ratios, not the absolute numbers).',
  '',
  '| setup | creates/s | create p50 ms | create p99 ms | inspect p50 ms | inspect p99 ms |',
  '|---|---|---|---|---|---|',
  ...results.map((r) => `| ${r['setup']} | ${r['createsPerSecond']} | ${r['createP50Ms']} | ${r['createP99Ms']} | ${r['inspectP50Ms']} | ${r['inspectP99Ms']} |`),
  '',
  `Ratios (2 replicas on PostgreSQL ÷ 1 on SQLite): creates/s ${(b['createsPerSecond']! / a['createsPerSecond']!).toFixed(2)}×, create p50 ${(b['createP50Ms']! / a['createP50Ms']!).toFixed(2)}×, inspect p50 ${(b['inspectP50Ms']! / a['inspectP50Ms']!).toFixed(2)}×.`,
  '',
].join('\n');
writeFileSync(join(dir, `replicas-${stamp}.json`), JSON.stringify({ command, results }, null, 2) + '\n');
writeFileSync(join(dir, `replicas-${stamp}.md`), md);
process.stdout.write(md);
process.exit(0);
