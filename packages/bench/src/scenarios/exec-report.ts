import { renderChart, type ChartPanel } from '../chart-svg.js';
import type { BenchReport } from '../result-types.js';
import { chartSubtitle, metricsTable, peerBars, renderCommon, type TableMetric } from '../report-common.js';
import { ratioCheck, TARGETS, type TargetCheck } from '../targets.js';
import type { ExecScenarioResult, PeerExecResult } from './exec-result.js';

type ExecReport = BenchReport<ExecScenarioResult>;

export function execTargets(result: ExecScenarioResult): TargetCheck[] {
  const dsec = result.peers.find((p) => p.name === 'dsec');
  const crun = result.peers.find((p) => p.name === 'crun');
  const floor = result.peers.find((p) => p.name === 'floor');
  return [
    ratioCheck(`exec p50 ≤ ${TARGETS.execRatio}× raw crun exec`, dsec?.exec.p50 ?? NaN, crun?.exec.p50 ?? NaN, TARGETS.execRatio, 'crun'),
    ratioCheck(
      `exec p50 ≤ ${TARGETS.execVsCrunNext}× raw crun exec (issue 32)`,
      dsec?.exec.p50 ?? NaN,
      crun?.exec.p50 ?? NaN,
      TARGETS.execVsCrunNext,
      'crun',
    ),
    ratioCheck(
      `exec p50 ≤ ${TARGETS.execVsFloor}× the kernel floor (issue 32)`,
      dsec?.exec.p50 ?? NaN,
      floor?.exec.p50 ?? NaN,
      TARGETS.execVsFloor,
      'floor',
    ),
  ];
}

const METRICS: TableMetric<PeerExecResult>[] = [
  { name: 'exec `true` p50 (ms)', get: (p) => p.exec.p50 },
  { name: 'p90 (ms)', get: (p) => p.exec.p90 },
  { name: 'p99 (ms)', get: (p) => p.exec.p99 },
  { name: 'min (ms)', get: (p) => p.exec.min },
  { name: 'max (ms)', get: (p) => p.exec.max },
  { name: 'mean (ms)', get: (p) => p.exec.mean },
];

export function renderExecReport(report: ExecReport, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as { count: number; rounds: number };
  const table = metricsTable(result.peers, METRICS);
  const crunP50 = result.peers.find((p) => p.name === 'crun')?.exec.p50 ?? NaN;
  const bars = (get: (p: PeerExecResult) => number): ChartPanel['bars'] => peerBars(result.peers, get);
  const svg = renderChart(`dsec bench exec — ${report.startedAt}`, chartSubtitle(report), [
    {
      title: 'exec `true` p50',
      unit: 'ms',
      better: 'lower',
      bars: bars((p) => p.exec.p50),
      target: { value: crunP50 * TARGETS.execRatio, label: `target ${TARGETS.execRatio}× crun` },
    },
    { title: 'exec `true` p99', unit: 'ms', better: 'lower', bars: bars((p) => p.exec.p99) },
  ]);
  const md = [
    `# dsec bench exec — ${report.startedAt}`,
    '',
    `\`true\` run to completion in one idle busybox sandbox per peer, ${o.count} times each, one at a time, ` +
      `in ${o.rounds} rounds with peers alternating. Latency is what the caller waits, output collected.`,
    '',
    table,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}
