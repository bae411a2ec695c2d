import { mdTable, profileTable, targetsTable } from './markdown.js';
import type { BenchReport } from './report.js';

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
