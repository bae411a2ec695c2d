import { readdirSync, readFileSync } from 'node:fs';
import { round } from '../stats.js';
import { renderChart } from '../chart-svg.js';
import { cgroupCharged } from '../cgroup-memory.js';
import { listProcesses, requireHeadroom, residentHelpers } from '../host-census.js';
import { summarizeLatency, timed, type LatencySummary } from '../latency.js';
import { memUsed, readMeminfo, settledMeminfo } from '../meminfo.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { type BenchReport, type PeerResultBase, type ScenarioResult } from '../result-types.js';
import { mdTable, ratio } from '../markdown.js';
import { chartSubtitle, metricsTable, peerBars, renderCommon, type TableMetric } from '../report-common.js';
import { pool } from '../rounds.js';
import { check, ratioCheck, TARGETS, type TargetCheck } from '../targets.js';
import { valuesOf, type BenchScenarioDef, type ScenarioContext } from './scenario.js';

export interface DensityOptions {
  /** Idle sandboxes each peer holds at once. @default 1000 */
  count: number;
  /** Creates (and removes) in flight. @default 8 */
  concurrency: number;
  /** Pause before each reading, for lazy kernel work (RCU frees, deferred slab) to finish. @default 5000 */
  settleMs: number;
  /** Probe sandboxes created (and an exec run in each) at every fill level of the curve. @default 5 */
  probes: number;
  /** The fill stops (and the run says so) when the host's MemAvailable falls below this (MiB). @default 6144 */
  minAvailableMiB: number;
}

/** Fill levels (fractions of `count`) at which the next sandbox's create and exec are timed. */
export const CURVE_LEVELS = [0, 0.1, 0.5, 1] as const;

/** The next sandbox's cost with `held` idle sandboxes already on the node. */
export interface CurvePoint {
  /** Fraction of `count` asked for at this point, and the idle sandboxes actually held. */
  level: number;
  held: number;
  /** Create of a probe sandbox (ms), and `true` run in it (ms). */
  create: LatencySummary;
  exec: LatencySummary;
  /** Host MemAvailable (MiB), open fds of this process, mounts in its namespace, at this point. */
  memAvailableMiB: number;
  fds: number;
  mounts: number;
}

export interface PeerDensityResult extends PeerResultBase {
  /** Idle sandboxes alive at the reading. */
  sandboxes: number;
  createSeconds: number;
  removeSeconds: number;
  /** Per idle sandbox: MemAvailable drop (MiB) and its rise on removal, kernel parts and cgroup charge (KiB). */
  perSandbox: {
    memAvailableMiB: number;
    freedMiB: number;
    slabKiB: number;
    sUnreclaimKiB: number;
    kernelStackKiB: number;
    pageTablesKiB: number;
    cgroupChargedKiB: number;
  };
  /** New host processes outside the sandboxes' cgroups while they idled, by command name. */
  helpers: Record<string, number>;
  helpersPerSandbox: number;
  /** The next sandbox's create and exec latency as the node fills (0 %, 10 %, 50 %, 100 % of `count`). */
  curve: CurvePoint[];
  /** Why the fill stopped short of `count` (a memory floor, a failing create), when it did. */
  stoppedEarly?: string;
}

export interface DensityResult extends ScenarioResult {
  peers: PeerDensityResult[];
}

const MAX_ERRORS = 3;

/** Fills the host with `count` idle sandboxes of one peer, reads what they cost, removes them; then the next peer. */
export async function runDensity(peers: Peer[], opts: DensityOptions, ctx: ScenarioContext): Promise<DensityResult> {
  const { signal, say } = ctx;
  const out: PeerDensityResult[] = [];
  const dropped: PeerUnavailable[] = [];
  for (const peer of peers) {
    signal.throwIfAborted();
    const errors: string[] = [];
    const ids: string[] = [];
    say(`${peer.name}: ${opts.count} idle sandboxes, ${opts.concurrency} creates in flight…`);
    const before = await settledMeminfo(opts.settleMs);
    const pids = new Set(listProcesses().map((p) => p.pid));
    const curve: CurvePoint[] = [];
    let stoppedEarly: string | undefined;
    let fillMs = 0;
    const targets = [...new Set(CURVE_LEVELS.map((l) => Math.round(l * opts.count)))];
    for (const [i, target] of targets.entries()) {
      const t0 = performance.now();
      await pool(Math.max(0, target - ids.length), opts.concurrency, async () => {
        signal.throwIfAborted();
        if (errors.length >= MAX_ERRORS || stoppedEarly) return;
        const avail = readMeminfo().memAvailableKiB / 1024;
        if (avail < opts.minAvailableMiB) {
          stoppedEarly = `MemAvailable ${Math.round(avail)} MiB fell below the floor of ${opts.minAvailableMiB} MiB (--min-available-mib) at ${ids.length} sandboxes`;
          return;
        }
        try {
          ids.push(await peer.create());
        } catch (err) {
          errors.push(`create #${ids.length + 1}: ${(err as Error).message}`);
        }
      }).catch((err: unknown) => {
        if (signal.aborted) throw err;
      });
      fillMs += performance.now() - t0;
      if (errors.length >= MAX_ERRORS) stoppedEarly ??= `${MAX_ERRORS} creates failed at ${ids.length} sandboxes; last: ${errors.at(-1)}`;
      curve.push(await probe(peer, CURVE_LEVELS[i] ?? target / opts.count, ids.length, opts.probes, errors));
      say(`  ${describePoint(curve.at(-1)!)}`);
      if (stoppedEarly) {
        say(`  stopped: ${stoppedEarly}`);
        break;
      }
    }
    const createSeconds = fillMs / 1000;
    say(`  ${ids.length} running after ${round(createSeconds, 1)} s; settling ${opts.settleMs} ms before reading…`);
    const full = await settledMeminfo(opts.settleMs);
    const helpers = residentHelpers(pids, peer.cgroupScope);
    const charged = cgroupCharged(peer.cgroupScope) / 1024;
    const t1 = performance.now();
    await pool(ids.length, opts.concurrency, async (i) => {
      try {
        await peer.remove(ids[i]!);
      } catch (err) {
        errors.push(`remove: ${(err as Error).message}`);
      }
    });
    const removeSeconds = (performance.now() - t1) / 1000;
    const after = await settledMeminfo(opts.settleMs);
    say(`  removed in ${round(removeSeconds, 1)} s`);
    if (errors.length >= MAX_ERRORS)
      dropped.push({ name: peer.name, reason: `stopped after ${MAX_ERRORS} failures; last: ${errors.at(-1)}` });
    const used = memUsed(before, full);
    const n = ids.length;
    const per = (kib: number, digits = 1): number => (n > 0 ? round(kib / n, digits) : NaN);
    const helperCount = Object.values(helpers).reduce((a, b) => a + b, 0);
    out.push({
      name: peer.name,
      description: peer.description,
      version: peer.version,
      errors,
      sandboxes: n,
      createSeconds: round(createSeconds, 2),
      removeSeconds: round(removeSeconds, 2),
      perSandbox: {
        memAvailableMiB: per(used.memAvailableKiB / 1024, 3),
        freedMiB: per((after.memAvailableKiB - full.memAvailableKiB) / 1024, 3),
        slabKiB: per(used.slabKiB),
        sUnreclaimKiB: per(used.sUnreclaimKiB),
        kernelStackKiB: per(used.kernelStackKiB),
        pageTablesKiB: per(used.pageTablesKiB),
        cgroupChargedKiB: per(charged),
      },
      helpers,
      helpersPerSandbox: per(helperCount, 2),
      curve,
      ...(stoppedEarly ? { stoppedEarly } : {}),
    });
  }
  return { peers: out, dropped };
}

/**
 * The next sandbox at this fill level: `n` probe sandboxes one at a time, each created (timed),
 * `true` run in it (timed) and removed (not timed), so the node is back at `held` after.
 */
async function probe(peer: Peer, level: number, held: number, n: number, errors: string[]): Promise<CurvePoint> {
  const create: number[] = [];
  const exec: number[] = [];
  for (let i = 0; i < n; i++) {
    let id: string | undefined;
    try {
      id = await timed(create, () => peer.create());
      await timed(exec, () => peer.exec(id!));
    } catch (err) {
      errors.push(`probe at ${held}: ${(err as Error).message}`);
    } finally {
      if (id) await peer.remove(id).catch((err: unknown) => void errors.push(`probe remove at ${held}: ${(err as Error).message}`));
    }
  }
  return {
    level,
    held,
    create: summarizeLatency(create),
    exec: summarizeLatency(exec),
    memAvailableMiB: Math.round(readMeminfo().memAvailableKiB / 1024),
    fds: readdirSync('/proc/self/fd').length,
    mounts: readFileSync('/proc/self/mountinfo', 'utf8').split('\n').length - 1,
  };
}

function describePoint(p: CurvePoint): string {
  return `${p.held} held: next create p50 ${p.create.p50} ms, exec p50 ${p.exec.p50} ms; MemAvailable ${p.memAvailableMiB} MiB, ${p.fds} fds, ${p.mounts} mounts`;
}

/** Latency at the fullest point over latency on the empty node (NaN when either is missing). */
export function fillRatio(curve: CurvePoint[], get: (p: CurvePoint) => number): number {
  const empty = curve[0];
  const full = curve.at(-1);
  if (!empty || !full || full === empty) return NaN;
  return get(full) / get(empty);
}

/** A new resident process for fewer than 1 in 20 sandboxes is another tenant's noise, not a per-sandbox helper. */
const HELPER_NOISE = 0.05;

export function densityTargets(result: DensityResult): TargetCheck[] {
  const d = result.peers.find((p) => p.name === 'dsec');
  const m = d?.perSandbox;
  const helpers = d
    ? Object.entries(d.helpers)
        .map(([k, v]) => `${k} ×${v}`)
        .join(', ') || 'none'
    : 'n/a';
  const curve = d?.curve ?? [];
  const empty = curve[0];
  const full = curve.length > 1 ? curve.at(-1) : undefined;
  const fullLabel = full ? `${full.held} held` : 'a full node';
  return [
    ratioCheck(
      `next create p50 on ${fullLabel} ≤ ${TARGETS.fullNodeRatio}× an empty node's`,
      full?.create.p50 ?? NaN,
      empty?.create.p50 ?? NaN,
      TARGETS.fullNodeRatio,
      'empty node',
    ),
    ratioCheck(
      `next exec p50 on ${fullLabel} ≤ ${TARGETS.fullNodeRatio}× an empty node's`,
      full?.exec.p50 ?? NaN,
      empty?.exec.p50 ?? NaN,
      TARGETS.fullNodeRatio,
      'empty node',
    ),
    check(
      `≤ ${TARGETS.memoryMiB} MiB host memory per idle sandbox (at ${d?.sandboxes ?? '?'})`,
      m?.memAvailableMiB ?? NaN,
      TARGETS.memoryMiB,
      'MiB',
      {
        measured: m
          ? `${m.memAvailableMiB} MiB MemAvailable drop (${m.freedMiB} MiB freed on removal; slab ${m.slabKiB} KiB, cgroup-charged ${m.cgroupChargedKiB} KiB)`
          : undefined,
      },
    ),
    check('no per-sandbox resident helper process', d?.helpersPerSandbox ?? NaN, HELPER_NOISE, 'per sandbox', {
      measured: d ? `${d.helpersPerSandbox} per sandbox (new host processes outside the sandboxes' cgroups: ${helpers})` : undefined,
    }),
  ];
}

const METRICS: TableMetric<PeerDensityResult>[] = [
  { name: 'idle sandboxes held', get: (p) => p.sandboxes },
  { name: 'host memory per idle sandbox (MiB, MemAvailable drop)', get: (p) => p.perSandbox.memAvailableMiB },
  { name: '… freed on removal (MiB per sandbox)', get: (p) => p.perSandbox.freedMiB },
  { name: 'slab per sandbox (KiB)', get: (p) => p.perSandbox.slabKiB },
  { name: '… of it unreclaimable, SUnreclaim (KiB)', get: (p) => p.perSandbox.sUnreclaimKiB },
  { name: 'kernel stacks per sandbox (KiB)', get: (p) => p.perSandbox.kernelStackKiB },
  { name: 'page tables per sandbox (KiB)', get: (p) => p.perSandbox.pageTablesKiB },
  { name: "charged to the sandboxes' own cgroups (KiB per sandbox)", get: (p) => p.perSandbox.cgroupChargedKiB },
  { name: 'resident helper processes per sandbox (outside its cgroup)', get: (p) => p.helpersPerSandbox },
  { name: 'time to create them all (s)', get: (p) => p.createSeconds },
  { name: 'time to remove them all (s)', get: (p) => p.removeSeconds },
];

export function renderDensity(report: BenchReport<DensityResult>, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as DensityOptions;
  const bars = (get: (p: PeerDensityResult) => number): ReturnType<typeof peerBars> => peerBars(result.peers, get);
  const svg = renderChart(`dsec bench density — ${report.startedAt}`, chartSubtitle(report), [
    {
      title: `host memory per idle sandbox, ${o.count} held`,
      unit: 'MiB (MemAvailable drop)',
      better: 'lower',
      bars: bars((p) => p.perSandbox.memAvailableMiB),
      target: { value: TARGETS.memoryMiB, label: `target ${TARGETS.memoryMiB} MiB` },
    },
    {
      title: "charged to the sandboxes' own cgroups",
      unit: 'KiB per sandbox',
      better: 'lower',
      bars: bars((p) => p.perSandbox.cgroupChargedKiB),
    },
    { title: 'slab growth', unit: 'KiB per sandbox', better: 'lower', bars: bars((p) => p.perSandbox.slabKiB) },
    { title: 'resident helper processes', unit: 'per sandbox', better: 'lower', bars: bars((p) => p.helpersPerSandbox) },
  ]);
  const helperLines = result.peers.map(
    (p) =>
      `- ${p.name}: ${
        Object.entries(p.helpers)
          .map(([k, v]) => `${k} ×${v}`)
          .join(', ') || 'none'
      }`,
  );
  const md = [
    `# dsec bench density — ${report.startedAt}`,
    '',
    `Each peer in turn (not interleaved) starts ${o.count} idle busybox sandboxes (64 MiB memory limit), ${o.concurrency} ` +
      `creates in flight, waits ${o.settleMs} ms, and reads /proc/meminfo, its sandboxes' cgroups and the host's process ` +
      'list; then removes them and reads again. Per sandbox = difference ÷ sandboxes held.',
    '',
    metricsTable(result.peers, METRICS),
    '',
    ...curveSection(result.peers, o),
    "New host processes outside the sandboxes' cgroups while they idled (per-sandbox helpers, and any other tenant's):",
    '',
    ...helperLines,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

/** The latency curve: one row per fill level, each peer's next-create and next-exec p50, and dsec ÷ crun. */
function curveSection(peers: PeerDensityResult[], o: DensityOptions): string[] {
  const dsec = peers.find((p) => p.name === 'dsec');
  const crun = peers.find((p) => p.name === 'crun');
  const levels = Math.max(0, ...peers.map((p) => p.curve.length));
  const rows = Array.from({ length: levels }, (_, i) => {
    const at = (p: PeerDensityResult | undefined): CurvePoint | undefined => p?.curve[i];
    const cells: (string | number)[] = [`${Math.round((at(dsec) ?? at(crun))!.level * 100)} %`];
    for (const p of peers) cells.push(at(p)?.held ?? 'n/a', at(p)?.create.p50 ?? 'n/a', at(p)?.exec.p50 ?? 'n/a');
    const d = at(dsec);
    const c = at(crun);
    cells.push(d && c ? ratio(d.create.p50, c.create.p50) : 'n/a', d && c ? ratio(d.exec.p50, c.exec.p50) : 'n/a');
    cells.push(d ? `${d.memAvailableMiB} MiB, ${d.fds} fds, ${d.mounts} mounts` : 'n/a');
    return cells;
  });
  const head = [
    'fill',
    ...peers.flatMap((p) => [`${p.name} held`, `${p.name} create p50 (ms)`, `${p.name} exec p50 (ms)`]),
    'create dsec ÷ crun',
    'exec dsec ÷ crun',
    'dsec: MemAvailable, fds, mounts',
  ];
  const out = [
    '## The next sandbox as the node fills',
    '',
    `At each fill level, ${o.probes} probe sandboxes one at a time: each created (timed), \`true\` run in it (timed), removed. ` +
      `The fill stops early when MemAvailable falls below ${o.minAvailableMiB} MiB or ${MAX_ERRORS} creates fail.`,
    '',
    mdTable(head, rows),
    '',
  ];
  for (const p of peers) {
    const cr = fillRatio(p.curve, (q) => q.create.p50);
    const ex = fillRatio(p.curve, (q) => q.exec.p50);
    out.push(
      `- ${p.name}: full ÷ empty: create ${round(cr, 2)}×, exec ${round(ex, 2)}×${p.stoppedEarly ? `; **stopped early**: ${p.stoppedEarly}` : ''}`,
    );
  }
  out.push('');
  return out;
}

export const densityScenario: BenchScenarioDef<DensityOptions, DensityResult> = {
  name: 'density',
  summary:
    'a node filled with N (1000) idle sandboxes, each peer in turn: memory per sandbox, resident helpers, next create/exec at 0/10/50/100 %',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'idle sandboxes per peer, held at once', default: 1000, min: 1 },
    { key: 'concurrency', long: 'concurrency', short: 'c', description: 'creates and removes in flight', default: 8, min: 1 },
    { key: 'settleMs', long: 'settle-ms', description: 'pause before each reading (ms)', default: 5000, min: 0 },
    { key: 'probes', long: 'probes', description: 'probe sandboxes (create + exec timed) at 0, 10, 50 and 100 % full', default: 5, min: 1 },
    {
      key: 'minAvailableMiB',
      long: 'min-available-mib',
      description: 'stop filling when host MemAvailable falls below this (MiB)',
      default: 6144,
      min: 0,
    },
  ],
  maxSandboxes: (o) => o.count,
  preflight: (o, peers) => requireHeadroom('density', o.count, peers),
  run: runDensity,
  targets: densityTargets,
  render: renderDensity,
  lines: (r) =>
    r.peers.map(
      (p) =>
        `${p.name.padEnd(7)} ${p.sandboxes} idle: ${p.perSandbox.memAvailableMiB} MiB/sandbox (freed ${p.perSandbox.freedMiB})  ` +
        `slab ${p.perSandbox.slabKiB} KiB  cgroup ${p.perSandbox.cgroupChargedKiB} KiB  helpers ${p.helpersPerSandbox}/sandbox  ` +
        `next create ${p.curve.map((c) => c.create.p50).join(' → ')} ms, exec ${p.curve.map((c) => c.exec.p50).join(' → ')} ms` +
        (p.stoppedEarly ? `  STOPPED: ${p.stoppedEarly}` : ''),
    ),
  headline: (r) => [
    {
      metric: `host memory per idle sandbox, ${r.peers[0]?.sandboxes ?? '?'} held (MiB)`,
      better: 'lower',
      values: valuesOf(r.peers, (p) => p.perSandbox.memAvailableMiB),
    },
    { metric: 'resident helper processes per sandbox', better: 'lower', values: valuesOf(r.peers, (p) => p.helpersPerSandbox) },
  ],
};
