import { renderChart } from '../chart-svg.js';
import { summarizeLatency, type LatencySummary } from '../latency.js';
import type { Peer } from '../peers/peer.js';
import { pauseBreakdown } from '../breakdown.js';
import { phaseKey, type Spans } from '../profile.js';
import { type BenchReport, type ProfileSection, type PeerResultBase, type ScenarioResult } from '../result-types.js';
import { chartSubtitle, metricsTable, peerBars, renderCommon, type TableMetric } from '../report-common.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import { msOf, oneSandboxRounds, type RoundsOptions } from './one-sandbox-rounds.js';
import { valuesOf, type BenchScenarioDef, type ScenarioContext } from './scenario.js';

export type PauseOptions = RoundsOptions;

const PHASE = 'pause/resume';

export interface PeerPauseResult extends PeerResultBase {
  pause: LatencySummary;
  resume: LatencySummary;
}

export interface PauseResult extends ScenarioResult {
  peers: PeerPauseResult[];
}

function pauseProfile(result: PauseResult, spans: Spans): ProfileSection[] {
  const d = result.peers.find((p) => p.name === 'dsec');
  if (!d || d.pause.count === 0) return [];
  return [
    {
      title: "Where dsec's pause + resume time goes (mean per pair)",
      rows: pauseBreakdown(spans, phaseKey('dsec', PHASE), d.pause.count, d.pause.mean + d.resume.mean),
    },
  ];
}

/** One idle sandbox per peer, paused and resumed `count` times, peers alternating. */
export async function runPause(peers: Peer[], opts: PauseOptions, ctx: ScenarioContext): Promise<PauseResult> {
  const { states, dropped } = await oneSandboxRounds(
    peers,
    ['pause', 'resume'],
    { ...opts, phase: PHASE, what: 'pause + resume' },
    ctx,
    async (peer, id) => ({ pause: await msOf(() => peer.pause(id)), resume: await msOf(() => peer.resume(id)) }),
  );
  return {
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.peer.pauseDescription,
      version: s.peer.version,
      errors: s.errors,
      pause: summarizeLatency(s.timings.pause),
      resume: summarizeLatency(s.timings.resume),
    })),
    dropped,
  };
}

export function pauseTargets(result: PauseResult): TargetCheck[] {
  const d = result.peers.find((p) => p.name === 'dsec');
  return [
    check(`pause p50 ≤ ${TARGETS.pauseMs} ms`, d?.pause.p50 ?? NaN, TARGETS.pauseMs, 'ms'),
    check(`resume p50 ≤ ${TARGETS.pauseMs} ms`, d?.resume.p50 ?? NaN, TARGETS.pauseMs, 'ms'),
  ];
}

const METRICS: TableMetric<PeerPauseResult>[] = [
  { name: 'pause p50 (ms)', get: (p) => p.pause.p50 },
  { name: 'pause p99 (ms)', get: (p) => p.pause.p99 },
  { name: 'resume p50 (ms)', get: (p) => p.resume.p50 },
  { name: 'resume p99 (ms)', get: (p) => p.resume.p99 },
  { name: 'pause min (ms)', get: (p) => p.pause.min },
  { name: 'resume min (ms)', get: (p) => p.resume.min },
];

export function renderPause(report: BenchReport<PauseResult>, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as PauseOptions;
  const target = { value: TARGETS.pauseMs, label: `target ${TARGETS.pauseMs} ms` };
  const svg = renderChart(`dsec bench pause — ${report.startedAt}`, chartSubtitle(report), [
    { title: 'pause p50', unit: 'ms', better: 'lower', bars: peerBars(result.peers, (p) => p.pause.p50), target },
    { title: 'resume p50', unit: 'ms', better: 'lower', bars: peerBars(result.peers, (p) => p.resume.p50), target },
    { title: 'pause p99', unit: 'ms', better: 'lower', bars: peerBars(result.peers, (p) => p.pause.p99) },
    { title: 'resume p99', unit: 'ms', better: 'lower', bars: peerBars(result.peers, (p) => p.resume.p99) },
  ]);
  const md = [
    `# dsec bench pause — ${report.startedAt}`,
    '',
    `One idle busybox sandbox per peer, paused and resumed ${o.count} times each, one at a time, in ${o.rounds} rounds ` +
      'with peers alternating. Latency is what the caller waits until the call returns (frozen / thawed).',
    '',
    metricsTable(result.peers, METRICS),
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const pauseScenario: BenchScenarioDef<PauseOptions, PauseResult> = {
  name: 'pause',
  summary: 'pause/resume latency: the API vs raw `crun pause/resume`, podman and docker pause/unpause',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'pause + resume pairs per peer', default: 200, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'alternating rounds', default: 10, min: 1 },
    { key: 'warmup', long: 'warmup', description: 'untimed pairs per peer first', default: 5, min: 0 },
  ],
  maxSandboxes: () => 8,
  run: runPause,
  profile: pauseProfile,
  targets: pauseTargets,
  render: renderPause,
  lines: (r) =>
    r.peers.map(
      (p) => `${p.name.padEnd(7)} pause p50 ${p.pause.p50} ms p99 ${p.pause.p99} ms  resume p50 ${p.resume.p50} ms p99 ${p.resume.p99} ms`,
    ),
  headline: (r) => [
    { metric: 'pause p50 (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.pause.p50) },
    { metric: 'resume p50 (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.resume.p50) },
  ],
};
