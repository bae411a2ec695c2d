import { round } from '../../demo/stats.js';
import { renderChart } from '../chart-svg.js';
import { cgroupCharged } from '../cgroup-memory.js';
import { listProcesses, requireHeadroom, residentHelpers } from '../host-census.js';
import { memUsed, settledMeminfo } from '../meminfo.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import type { BenchReport } from '../report.js';
import { chartSubtitle, metricsTable, peerBars, renderCommon, type TableMetric } from '../report-common.js';
import { pool } from '../rounds.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import { valuesOf, type BenchScenarioDef, type PeerResultBase, type ScenarioContext, type ScenarioResult } from './scenario.js';

export interface DensityOptions {
  /** Idle sandboxes each peer holds at once. @default 1000 */
  count: number;
  /** Creates (and removes) in flight. @default 8 */
  concurrency: number;
  /** Pause before each reading, for lazy kernel work (RCU frees, deferred slab) to finish. @default 5000 */
  settleMs: number;
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
    const t0 = performance.now();
    await pool(opts.count, opts.concurrency, async () => {
      signal.throwIfAborted();
      if (errors.length >= MAX_ERRORS) return;
      try {
        ids.push(await peer.create());
      } catch (err) {
        errors.push(`create: ${(err as Error).message}`);
      }
    }).catch((err: unknown) => {
      if (signal.aborted) throw err;
    });
    const createSeconds = (performance.now() - t0) / 1000;
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
    if (errors.length >= MAX_ERRORS) dropped.push({ name: peer.name, reason: `stopped after ${MAX_ERRORS} failures; last: ${errors.at(-1)}` });
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
    });
  }
  return { peers: out, dropped };
}

/** A new resident process for fewer than 1 in 20 sandboxes is another tenant's noise, not a per-sandbox helper. */
const HELPER_NOISE = 0.05;

export function densityTargets(result: DensityResult): TargetCheck[] {
  const d = result.peers.find((p) => p.name === 'dsec');
  const m = d?.perSandbox;
  const helpers = d ? Object.entries(d.helpers).map(([k, v]) => `${k} ×${v}`).join(', ') || 'none' : 'n/a';
  return [
    check(`≤ ${TARGETS.memoryMiB} MiB host memory per idle sandbox (at ${d?.sandboxes ?? '?'})`, m?.memAvailableMiB ?? NaN, TARGETS.memoryMiB, 'MiB', {
      measured: m ? `${m.memAvailableMiB} MiB MemAvailable drop (${m.freedMiB} MiB freed on removal; slab ${m.slabKiB} KiB, cgroup-charged ${m.cgroupChargedKiB} KiB)` : undefined,
    }),
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
    { title: "charged to the sandboxes' own cgroups", unit: 'KiB per sandbox', better: 'lower', bars: bars((p) => p.perSandbox.cgroupChargedKiB) },
    { title: 'slab growth', unit: 'KiB per sandbox', better: 'lower', bars: bars((p) => p.perSandbox.slabKiB) },
    { title: 'resident helper processes', unit: 'per sandbox', better: 'lower', bars: bars((p) => p.helpersPerSandbox) },
  ]);
  const helperLines = result.peers.map(
    (p) => `- ${p.name}: ${Object.entries(p.helpers).map(([k, v]) => `${k} ×${v}`).join(', ') || 'none'}`,
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
    'New host processes outside the sandboxes\' cgroups while they idled (per-sandbox helpers, and any other tenant\'s):',
    '',
    ...helperLines,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const densityScenario: BenchScenarioDef<DensityOptions, DensityResult> = {
  name: 'density',
  summary: 'host memory and resident helpers per idle sandbox with N (1000) held at once, each peer in turn',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'idle sandboxes per peer, held at once', default: 1000, min: 1 },
    { key: 'concurrency', long: 'concurrency', short: 'c', description: 'creates and removes in flight', default: 8, min: 1 },
    { key: 'settleMs', long: 'settle-ms', description: 'pause before each reading (ms)', default: 5000, min: 0 },
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
        `slab ${p.perSandbox.slabKiB} KiB  cgroup ${p.perSandbox.cgroupChargedKiB} KiB  helpers ${p.helpersPerSandbox}/sandbox`,
    ),
  headline: (r) => [
    { metric: `host memory per idle sandbox, ${r.peers[0]?.sandboxes ?? '?'} held (MiB)`, better: 'lower', values: valuesOf(r.peers, (p) => p.perSandbox.memAvailableMiB) },
    { metric: 'resident helper processes per sandbox', better: 'lower', values: valuesOf(r.peers, (p) => p.helpersPerSandbox) },
  ],
};
