import { writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import type { HostInfo } from './host-info.js';
import { mdTable, ratio, targetsTable } from './markdown.js';
import type { PeerName } from './peers/peer.js';
import { fileStamp, type WrittenFiles } from './report.js';
import { type BenchReport } from './result-types.js';
import type { BenchScenarioDef, HeadlineMetric } from './scenarios/scenario.js';
import type { TargetCheck } from './targets.js';

/** `dsec bench all`'s combined result: each scenario's headline figures and targets, and where its full report is. */
export interface AllSummary {
  startedAt: string;
  finishedAt: string;
  host: HostInfo;
  options: { peers: PeerName[]; nice: number };
  scenarios: {
    scenario: string;
    report: string;
    headline: HeadlineMetric[];
    targets: TargetCheck[];
    unavailable: BenchReport['unavailable'];
  }[];
  failed: { scenario: string; error: string }[];
  cleanup: BenchReport['cleanup'];
}

const PEER_ORDER: PeerName[] = ['dsec', 'crun', 'podman', 'docker'];

export function buildAllSummary(input: {
  startedAt: string;
  host: HostInfo;
  peers: PeerName[];
  nice: number;
  reports: { report: BenchReport; files: WrittenFiles }[];
  failed: { scenario: string; error: string }[];
  defs: BenchScenarioDef[];
}): AllSummary {
  const last = input.reports.at(-1)?.report;
  return {
    startedAt: input.startedAt,
    finishedAt: last?.finishedAt ?? new Date().toISOString(),
    host: input.host,
    options: { peers: input.peers, nice: input.nice },
    scenarios: input.reports.map(({ report, files }) => ({
      scenario: report.scenario,
      report: basename(files.markdown),
      headline: input.defs.find((d) => d.name === report.scenario)?.headline(report.result) ?? [],
      targets: report.targets,
      unavailable: report.unavailable,
    })),
    failed: input.failed,
    cleanup: last?.cleanup ?? { errors: [], leaks: [] },
  };
}

/** One table of every scenario's headline figures with dsec ÷ peer ratios, then every target. */
export function renderAllMarkdown(s: AllSummary): string {
  const peers = PEER_ORDER.filter((p) => s.scenarios.some((sc) => sc.headline.some((h) => Number.isFinite(h.values[p] ?? NaN))));
  const others = peers.filter((p) => p !== 'dsec');
  const rows = s.scenarios.flatMap((sc) =>
    sc.headline.map((h) => [
      sc.scenario,
      `${h.metric}${h.better === 'higher' ? ' ↑' : ''}`,
      ...peers.map((p) => h.values[p] ?? NaN),
      ...others.map((p) => ratio(h.values.dsec ?? NaN, h.values[p] ?? NaN)),
    ]),
  );
  const targets = s.scenarios.flatMap((sc) => sc.targets.map((t) => ({ ...t, target: `${sc.scenario}: ${t.target}` })));
  const h = s.host;
  const cleanOk = s.cleanup.errors.length === 0 && s.cleanup.leaks.length === 0;
  return [
    `# dsec bench all — ${s.startedAt}`,
    '',
    'Every scenario in one run, on the same peers. Each row is one headline figure; `dsec ÷ peer` below 1 is dsec ' +
      'ahead for times and memory, above 1 is dsec ahead for rows marked ↑ (higher is better). Full reports: ' +
      s.scenarios.map((sc) => `[${sc.scenario}](${sc.report})`).join(', ') +
      '.',
    '',
    mdTable(['scenario', 'metric', ...peers, ...others.map((p) => `dsec ÷ ${p}`)], rows),
    '',
    ...(s.failed.length ? ['**Failed:**', '', ...s.failed.map((f) => `- ${f.scenario}: ${f.error}`), ''] : []),
    ...unavailableLines(s),
    '## Targets (from the issues)',
    '',
    targetsTable(targets),
    '',
    '## Host and command',
    '',
    `- \`${h.commandLine}\``,
    `- ${h.os}, kernel ${h.kernel}, ${h.cpus} × ${h.cpuModel}, ${h.memTotalMiB} MiB, load average ${h.loadAverage1m} at start`,
    `- node ${h.node}, dsec ${h.dsec}`,
    `- ${s.startedAt} → ${s.finishedAt}`,
    `- cleanup: ${cleanOk ? 'verified, nothing left (containers, mounts, cgroups, daemons, temp dirs)' : [...s.cleanup.errors, ...s.cleanup.leaks.map((l) => `leaked ${l}`)].join('; ')}`,
    '',
  ].join('\n');
}

/** Each peer that did not run in some scenario, once per reason. */
function unavailableLines(s: AllSummary): string[] {
  const seen = new Map<string, string[]>();
  for (const sc of s.scenarios)
    for (const u of sc.unavailable) {
      const key = `**${u.name}**: ${u.reason}`;
      seen.set(key, [...(seen.get(key) ?? []), sc.scenario]);
    }
  if (seen.size === 0) return [];
  return ['**Did not run (or not applicable):**', '', ...[...seen].map(([k, sc]) => `- ${k} (${sc.join(', ')})`), ''];
}

/** Writes `all-<stamp>.{json,md}` and refreshes `latest-all.md`. */
export function writeAllSummary(
  outDir: string,
  input: Parameters<typeof buildAllSummary>[0],
): { summary: AllSummary; files: { json: string; markdown: string; latest: string } } {
  const summary = buildAllSummary(input);
  const dir = resolve(outDir);
  const base = `all-${fileStamp(summary.startedAt)}`;
  const files = { json: join(dir, `${base}.json`), markdown: join(dir, `${base}.md`), latest: join(dir, 'latest-all.md') };
  const md = renderAllMarkdown(summary);
  writeFileSync(files.json, JSON.stringify(summary, null, 2) + '\n');
  writeFileSync(files.markdown, md);
  writeFileSync(files.latest, md);
  return { summary, files };
}
