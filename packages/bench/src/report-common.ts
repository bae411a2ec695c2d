import type { ChartPanel } from './chart-svg.js';
import { mdTable, profileTable, ratio, targetsTable } from './markdown.js';
import type { BenchReport, PeerResultBase } from './result-types.js';

/** One row of a scenario's results table: a figure of each peer. */
export interface TableMetric<P> {
  name: string;
  get: (p: P) => number;
}

/** Metric rows, one column per peer, then "dsec ÷ peer" for every other peer. */
export function metricsTable<P extends PeerResultBase>(peers: P[], metrics: TableMetric<P>[]): string {
  const dsec = peers.find((p) => p.name === 'dsec');
  const others = peers.filter((p) => p.name !== 'dsec');
  return mdTable(
    ['metric', ...peers.map((p) => p.name), ...others.map((o) => `dsec ÷ ${o.name}`)],
    metrics.map((m) => [m.name, ...peers.map((p) => m.get(p)), ...others.map((o) => (dsec ? ratio(m.get(dsec), m.get(o)) : 'n/a'))]),
  );
}

/** One chart bar per peer. */
export function peerBars<P extends PeerResultBase>(peers: P[], get: (p: P) => number): ChartPanel['bars'] {
  return peers.map((p) => ({ label: p.name, value: get(p) }));
}

/** The chart's subtitle: the machine. */
export function chartSubtitle(report: BenchReport): string {
  return `${report.host.os}, kernel ${report.host.kernel}, ${report.host.cpus} CPUs, ${report.host.memTotalMiB} MiB`;
}

/** The sections every scenario's markdown ends with: who did not run, targets, profile, peers, host, cleanup, chart. */
export function renderCommon(report: BenchReport, svgName: string): string[] {
  const out: string[] = [];
  if (report.unavailable.length) {
    out.push('**Did not run (or stopped):**', '');
    for (const u of report.unavailable) out.push(`- **${u.name}**: ${u.reason}`);
    out.push('');
  }
  out.push('## Targets (from the issues)', '', targetsTable(report.targets), '');
  for (const p of report.profile) out.push(`## ${p.title}`, '', profileTable(p.rows), '');
  if (report.notInstrumented.length)
    out.push(`Not found in this build, so counted in their parent's remainder: ${report.notInstrumented.join(', ')}.`, '');
  out.push(
    '## Peers',
    '',
    mdTable(
      ['peer', 'what is timed', 'version'],
      report.result.peers.map((p) => [p.name, p.description, p.version]),
    ),
    '',
  );
  const errors = report.result.peers.filter((p) => p.errors.length);
  if (errors.length) {
    out.push('Errors during the run:', '');
    for (const p of errors) for (const e of p.errors) out.push(`- ${p.name}: ${e}`);
    out.push('');
  }
  const h = report.host;
  out.push(
    '## Host and command',
    '',
    `- \`${h.commandLine}\``,
    `- ${h.os}, kernel ${h.kernel}, ${h.cpus} × ${h.cpuModel}, ${h.memTotalMiB} MiB, load average ${h.loadAverage1m} at start, ${report.loadAverage1mAtEnd} at end (a shared host: other jobs ran during the run)`,
    `- node ${h.node}, dsec ${h.dsec}`,
    `- ${report.startedAt} → ${report.finishedAt}`,
    `- cleanup: ${report.cleanup.leaks.length === 0 && report.cleanup.errors.length === 0 ? 'verified, nothing left (containers, mounts, cgroups, temp dirs)' : [...report.cleanup.errors, ...report.cleanup.leaks.map((l) => `leaked ${l}`)].join('; ')}`,
    '',
    `![chart](${svgName})`,
    '',
  );
  return out;
}
