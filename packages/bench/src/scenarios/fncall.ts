import { spawn } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Pool, Sandbox, fn, type PoolInfo } from '@dsec/sdk';
import { renderChart } from '../chart-svg.js';
import { summarizeLatency, type LatencySummary } from '../latency.js';
import { mdTable, ratio } from '../markdown.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import type { BenchReport, PeerResultBase, ScenarioResult } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { check, type TargetCheck } from '../targets.js';
import { Crun, LayerMounts, tryUnmount, buildOciConfig, mountOverlay, SandboxPaths } from 'dsec/container';
import { removeCgroupTree, mountsUnder, runTool } from 'dsec/host';
import { buildFnRuntimeImage, type LayerDigest } from 'dsec/runtime';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';

export interface FnCallOptions {
  /** Calls per way and concurrency. */
  count: number;
  /** Calls per concurrency for the two ways that make a container per call (crun run, dsec sandbox); 0: `count`. */
  perCallCount: number;
  /** Pool claims timed through the API. */
  claims: number;
  /** The highest of the concurrencies 1, 8, 32 to run (the suite's CI-size run stops at 8). */
  maxConcurrency: number;
}

const CONCURRENCY = [1, 8, 32];
const PYTHON = '/usr/bin/python3';

/**
 * The reward function every way runs: a candidate solution (as a trainer gets it from a model)
 * against 5 test cases, printing the fraction passed.
 */
export const REWARD_PROGRAM = [
  'CANDIDATE = """',
  'def solve(xs):',
  '    out = []',
  '    for x in sorted(xs):',
  '        if not out or out[-1] != x:',
  '            out.append(x)',
  '    return out',
  '"""',
  'TESTS = [([3, 1, 2], [1, 2, 3]), ([1, 1, 1], [1]), ([], []), ([5, -1, 5, 0], [-1, 0, 5]), (list(range(50, 0, -1)), list(range(1, 51)))]',
  'ns = {}',
  'exec(CANDIDATE, ns)',
  'passed = sum(1 for inp, want in TESTS if ns["solve"](list(inp)) == want)',
  'print(passed / len(TESTS))',
].join('\n');

export type FnWay = 'host' | 'crun' | 'sandbox' | 'fn';
const WAYS: { way: FnWay; what: string }[] = [
  { way: 'host', what: 'bare `python3 -c PROGRAM` on the host, no isolation (the ceiling)' },
  {
    way: 'crun',
    what: "a fresh `crun run` per call: overlay over the fn-runtime layer, dsec's OCI config, python3 as the process, delete after",
  },
  { way: 'sandbox', what: 'a dsec sandbox per call through the SDK: Sandbox.create(fn-runtime) + commands.run(python3 -c PROGRAM) + kill' },
  { way: 'fn', what: 'fn.run({runtime: python, code: PROGRAM}) through the API: a warm worker, a fork of its python fork server' },
];

export interface WayFigures {
  way: FnWay;
  concurrency: number;
  calls: number;
  seconds: number;
  callsPerSecond: number;
  latency: LatencySummary;
  wrong: number;
  errors: string[];
}

export interface FnCallPeerResult extends PeerResultBase {
  runs: WayFigures[];
  /** Sandbox.create({pool}) through the API, client side. */
  poolClaim: LatencySummary;
  /** The same claims as the server timed them (control plane only). */
  poolClaimServerP50: number;
  poolMisses: number;
  /** fn calls that started their worker (the warm-ups), edge side. */
  fnColdStart: LatencySummary;
}

export interface FnCallResult extends ScenarioResult {
  peers: FnCallPeerResult[];
}

/** Runs `n` calls of `one`, `concurrency` at a time; latencies in ms and wall seconds. */
async function drive(
  n: number,
  concurrency: number,
  one: () => Promise<boolean>,
  signal: AbortSignal,
): Promise<{ ms: number[]; seconds: number; wrong: number; errors: string[] }> {
  const ms: number[] = [];
  const errors: string[] = [];
  let wrong = 0;
  let next = 0;
  const t0 = performance.now();
  const worker = async (): Promise<void> => {
    while (next < n && !signal.aborted) {
      next++;
      const t = performance.now();
      try {
        if (!(await one())) wrong++;
        ms.push(performance.now() - t);
      } catch (err) {
        if (errors.length < 5) errors.push((err as Error).message);
        else errors.push('…');
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { ms, seconds: (performance.now() - t0) / 1000, wrong, errors: errors.slice(0, 6) };
}

function hostCall(): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ['-c', REWARD_PROGRAM], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(out === '1.0\n') : reject(new Error(`python3 exited ${code}`))));
  });
}

/** `crun run` (foreground) of one bundle per call, then crun delete, unmount, cgroup removal. */
class CrunPerCall {
  readonly crun: Crun;
  #n = 0;
  constructor(
    private readonly dir: string,
    private readonly lowerDir: string,
    private readonly fixtureConfig: Parameters<typeof buildOciConfig>[0]['config'],
    private readonly cgroupParent: string,
  ) {
    this.crun = new Crun(join(dir, 'crun-state'));
    mkdirSync(join(dir, 'c'), { recursive: true });
  }

  async call(): Promise<boolean> {
    const id = `${this.cgroupParent}-${++this.#n}`;
    const paths = new SandboxPaths(join(this.dir, 'c', id));
    mkdirSync(paths.dir);
    try {
      mountOverlay([this.lowerDir], paths.upper, paths.work, paths.rootfs);
      const config = buildOciConfig({ id, config: this.fixtureConfig, env: {}, limits: { cpu: 1, memoryMiB: 256, pids: 256 } });
      (config['linux'] as Record<string, unknown>)['cgroupsPath'] = `/${this.cgroupParent}/${id}`;
      const proc = config['process'] as Record<string, unknown>;
      proc['args'] = ['python3', '-c', REWARD_PROGRAM];
      proc['terminal'] = false;
      writeFileSync(paths.config, JSON.stringify(config));
      const r = await runTool('crun', [...this.crun.globalArgs(), 'run', '--bundle', paths.dir, id]);
      if (r.code !== 0) throw new Error(`crun run exited ${r.code}: ${r.stderr.trim().slice(0, 300)}`);
      return r.stdout === '1.0\n';
    } finally {
      await this.crun.delete(id).catch(() => undefined);
      for (const m of mountsUnder(paths.dir).reverse()) tryUnmount(m.mountPoint);
      removeCgroupTree(`${this.cgroupParent}/${id}`);
      rmSync(paths.dir, { recursive: true, force: true });
    }
  }

  close(): void {
    for (const m of mountsUnder(join(this.dir, 'c')).reverse()) tryUnmount(m.mountPoint);
    removeCgroupTree(this.cgroupParent);
  }
}

export async function runFnCall(peers: Peer[], opts: FnCallOptions, ctx: ScenarioContext): Promise<FnCallResult> {
  const dsec = peers.find((p): p is DsecApiPeer => p instanceof DsecApiPeer);
  if (!dsec || !ctx.fixture) throw new Error("the fncall scenario needs the dsec peer and the run's in-process dsec");
  const dropped: PeerUnavailable[] = peers
    .filter((p) => p.name !== 'dsec')
    .map((p) => ({
      name: p.name,
      reason:
        'the fncall scenario runs its own four ways side by side (host python3, crun run per call, dsec sandbox per call, dsec fn); raw crun is one of them',
    }));
  ctx.say('building the fn-runtime image (host python3, bash, node)');
  const built = await buildFnRuntimeImage(ctx.fixture.dsec.images, { progress: (m) => ctx.say(`  ${m}`) });
  const manifest = ctx.fixture.dsec.images.get(built.id)!;
  const layer = manifest.layers[0] as LayerDigest;
  const mounts = new LayerMounts(join(ctx.fixture.dir, 'fn-layers'), ctx.fixture.dsec.images.layers);
  const lowerDir = await mounts.acquire(layer);
  const crun = new CrunPerCall(join(ctx.fixture.dir, 'fn-crun'), lowerDir, manifest.config, `${ctx.names.edgeId}fncrun`);
  const conn = dsec.conn;
  const runs: WayFigures[] = [];
  const coldStarts: number[] = [];
  const warmErrors: string[] = [];
  try {
    // One warm-up call per way, so no way pays a one-time cost in its first timed call (the fn
    // workers of the first concurrency are then started inside the timed run, as in real use).
    await hostCall();
    await crun.call();
    await fn.run({ runtime: 'python', code: REWARD_PROGRAM }, conn);
    for (const concurrency of CONCURRENCY.filter((c) => c <= opts.maxConcurrency)) {
      for (const { way } of WAYS) {
        if (ctx.signal.aborted) break;
        const n = way === 'crun' || way === 'sandbox' ? opts.perCallCount || opts.count : opts.count;
        ctx.say(`${way}: ${n} calls at concurrency ${concurrency}`);
        const one: () => Promise<boolean> =
          way === 'host'
            ? hostCall
            : way === 'crun'
              ? () => crun.call()
              : way === 'fn'
                ? async () => {
                    const r = await fn.run({ runtime: 'python', code: REWARD_PROGRAM, memoryMiB: 256 }, conn);
                    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}: ${r.stderr.slice(0, 200)}`);
                    return r.stdout === '1.0\n';
                  }
                : async () => {
                    const sb = await Sandbox.create({
                      ...conn,
                      image: built.name,
                      resources: { memoryMiB: 256 },
                      labels: { bench: 'fncall' },
                    });
                    try {
                      const r = await sb.commands.run(['python3', '-c', REWARD_PROGRAM]);
                      return r.stdout === '1.0\n';
                    } finally {
                      await sb.kill();
                    }
                  };
        // fn runs on warm workers: as many as the concurrency are started before the timed calls
        // (a trainer's steady state; the cold start of a worker is a sandbox create plus python's).
        if (way === 'fn') {
          const warm = await Promise.allSettled(
            Array.from({ length: concurrency }, () => fn.run({ runtime: 'python', code: REWARD_PROGRAM, memoryMiB: 256 }, conn)),
          );
          for (const w of warm) {
            if (w.status === 'fulfilled' && w.value.coldStart) coldStarts.push(w.value.durationMs);
            if (w.status === 'rejected') warmErrors.push(`warm-up at concurrency ${concurrency}: ${(w.reason as Error).message}`);
          }
        }
        const d = await drive(n, concurrency, one, ctx.signal);
        runs.push({
          way,
          concurrency,
          calls: d.ms.length,
          seconds: Math.round(d.seconds * 100) / 100,
          callsPerSecond: Math.round((d.ms.length / d.seconds) * 10) / 10,
          latency: summarizeLatency(d.ms),
          wrong: d.wrong,
          errors: d.errors,
        });
      }
    }
  } finally {
    crun.close();
    mounts.release(layer);
  }

  // Pool claims: a pool of 8 ready busybox sandboxes; claims in rounds of 8 (then the pool refills).
  ctx.say(`pool: ${opts.claims} claims through the API`);
  const claimMs: number[] = [];
  const poolSpec = { image: 'busybox', resources: { memoryMiB: 64 } };
  let pool: PoolInfo | undefined;
  try {
    await Pool.create({ ...conn, name: 'bench-claims', size: 8, ...poolSpec });
    while (claimMs.length < opts.claims && !ctx.signal.aborted) {
      for (;;) {
        const { info: p } = await Pool.get('bench-claims', conn);
        if (p.ready >= 8) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      const got: Sandbox[] = [];
      for (let i = 0; i < 8 && claimMs.length < opts.claims; i++) {
        const t = performance.now();
        got.push(await Sandbox.create({ ...conn, ...poolSpec, pool: 'bench-claims' }));
        claimMs.push(performance.now() - t);
      }
      await Promise.all(got.map((s) => s.kill()));
    }
    pool = (await Pool.get('bench-claims', conn)).info;
  } catch (err) {
    warmErrors.push(`pool claims: ${(err as Error).message}`);
  } finally {
    await Pool.delete('bench-claims', conn).catch(() => undefined);
  }
  return {
    peers: [
      {
        name: 'dsec',
        description: WAYS.map((w) => `${w.way}: ${w.what}`).join('; '),
        version: dsec.version,
        errors: [...warmErrors, ...runs.flatMap((r) => r.errors.map((e) => `${r.way} c${r.concurrency}: ${e}`))],
        runs,
        poolClaim: summarizeLatency(claimMs),
        poolClaimServerP50: pool?.claimMsP50 ?? NaN,
        poolMisses: pool?.misses ?? NaN,
        fnColdStart: summarizeLatency(coldStarts),
      },
    ],
    dropped,
  };
}

function fig(r: FnCallResult, way: FnWay, c: number): WayFigures | undefined {
  return r.peers[0]?.runs.find((x) => x.way === way && x.concurrency === c);
}

export function fnCallTargets(r: FnCallResult): TargetCheck[] {
  const out: TargetCheck[] = [];
  for (const c of CONCURRENCY) {
    const host = fig(r, 'host', c);
    const f = fig(r, 'fn', c);
    const share = host && f ? f.callsPerSecond / host.callsPerSecond : NaN;
    out.push(check(`fn calls ≥ 80 % of bare host python3 throughput at concurrency ${c}`, share * 100, 80, '%', { atLeast: true }));
  }
  out.push(check('pool claim p50 ≤ 5 ms through the API', r.peers[0]?.poolClaim.p50 ?? NaN, 5, 'ms'));
  return out;
}

function rows(r: FnCallResult): (string | number)[][] {
  const out: (string | number)[][] = [];
  for (const c of CONCURRENCY) {
    const host = fig(r, 'host', c);
    for (const { way } of WAYS) {
      const x = fig(r, way, c);
      if (!x) continue;
      out.push([
        c,
        way,
        x.calls,
        x.callsPerSecond,
        host ? ratio(x.callsPerSecond, host.callsPerSecond) : 'n/a',
        x.latency.p50,
        x.latency.p99,
        x.wrong,
        x.errors.length,
      ]);
    }
  }
  return out;
}

export function renderFnCall(report: BenchReport<FnCallResult>, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as FnCallOptions;
  const p = result.peers[0];
  const svg = renderChart(
    `dsec bench fncall — ${report.startedAt}`,
    chartSubtitle(report),
    CONCURRENCY.map((c) => ({
      title: `calls/s at concurrency ${c}`,
      unit: 'calls/s',
      better: 'higher' as const,
      bars: WAYS.map(({ way }) => ({ label: way, value: fig(result, way, c)?.callsPerSecond ?? NaN })),
    })),
  );
  const md = [
    `# dsec bench fncall — ${report.startedAt}`,
    '',
    `The same reward function (a candidate solution against 5 test cases, ${REWARD_PROGRAM.split('\n').length} lines of python) four ways, ` +
      `${o.count} calls per way and concurrency (${o.perCallCount || o.count} for the two that make a container per call), at concurrency ${CONCURRENCY.join(', ')}:`,
    '',
    ...WAYS.map((w) => `- **${w.way}**: ${w.what}`),
    '',
    mdTable(['concurrency', 'way', 'calls', 'calls/s', '÷ host', 'p50 (ms)', 'p99 (ms)', 'wrong answers', 'errors'], rows(result)),
    '',
    `Pool claims: ${p?.poolClaim.count ?? 0} creates naming a pool of 8 ready busybox sandboxes through the SDK (HTTP, loopback), ` +
      `in rounds of 8 with a refill between: p50 ${p?.poolClaim.p50} ms, p99 ${p?.poolClaim.p99} ms client side; ` +
      `the control plane's own share p50 ${p?.poolClaimServerP50} ms; misses ${p?.poolMisses}.`,
    '',
    `fn workers are warmed before each timed fn run (as many calls at once as the concurrency); the ${p?.fnColdStart.count ?? 0} calls that started a ` +
      `worker took p50 ${p?.fnColdStart.p50} ms, max ${p?.fnColdStart.max} ms (a sandbox create, python3 start and its stdlib imports).`,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const fnCallScenario: BenchScenarioDef<FnCallOptions, FnCallResult> = {
  name: 'fncall',
  summary:
    'function calls: a python reward function as host python3, crun run per call, a dsec sandbox per call and fn/run, at concurrency 1, 8, 32; pool claims',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'calls per way and concurrency', default: 1000, min: 1 },
    {
      key: 'perCallCount',
      long: 'per-call-count',
      description: 'calls for crun-per-call and sandbox-per-call (0: --count)',
      default: 0,
      min: 0,
    },
    { key: 'claims', long: 'claims', description: 'pool claims timed', default: 80, min: 1 },
    { key: 'maxConcurrency', long: 'max-concurrency', description: 'highest concurrency of 1, 8, 32 to run', default: 32, min: 1 },
  ],
  maxSandboxes: () => 80,
  run: runFnCall,
  targets: fnCallTargets,
  render: renderFnCall,
  lines: (r) => [
    ...(r.peers[0]?.runs ?? []).map(
      (x) =>
        `c${String(x.concurrency).padEnd(3)} ${x.way.padEnd(8)} ${String(x.callsPerSecond).padStart(7)} calls/s  p50 ${x.latency.p50} ms  p99 ${x.latency.p99} ms${x.wrong ? `  ${x.wrong} wrong` : ''}${x.errors.length ? `  ${x.errors.length} errors` : ''}`,
    ),
    `pool claim p50 ${r.peers[0]?.poolClaim.p50} ms (server ${r.peers[0]?.poolClaimServerP50} ms)`,
  ],
  headline: (r) => [
    ...CONCURRENCY.map((c) => ({
      metric: `fn calls/s at concurrency ${c}`,
      better: 'higher' as const,
      values: { dsec: fig(r, 'fn', c)?.callsPerSecond ?? NaN },
    })),
    { metric: 'pool claim p50 (ms)', better: 'lower' as const, values: { dsec: r.peers[0]?.poolClaim.p50 ?? NaN } },
  ],
};
