import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { ProfileRow } from './breakdown.js';
import type { HostInfo } from './host-info.js';
import type { PeerUnavailable } from './peers/peer.js';
import type { CreateScenarioResult } from './scenarios/create.js';
import type { ExecScenarioResult } from './scenarios/exec.js';
import type { TargetCheck } from './targets.js';
import { createTargets, renderCreateReport } from './report-create.js';
import { execTargets, renderExecReport } from './report-exec.js';

export interface ProfileSection {
  title: string;
  rows: ProfileRow[];
}

interface ReportBase {
  startedAt: string;
  finishedAt: string;
  host: HostInfo;
  /** 1-minute load average when the run ended (see host.loadAverage1m for the start). */
  loadAverage1mAtEnd: number;
  options: Record<string, unknown>;
  /** Asked-for peers that could not run or stopped working, with why. */
  unavailable: PeerUnavailable[];
  targets: TargetCheck[];
  profile: ProfileSection[];
  /** Server steps the profiler could not find in this build of dsec. */
  notInstrumented: string[];
  cleanup: { errors: string[]; leaks: string[] };
}

export type BenchReport = ReportBase &
  ({ scenario: 'create'; result: CreateScenarioResult } | { scenario: 'exec'; result: ExecScenarioResult });

/** `2025-01-31T12:34:56.789Z` → `20250131T123456Z`: sortable, and safe in a file name. */
export function fileStamp(iso: string): string {
  return iso.replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');
}

export interface WrittenFiles {
  json: string;
  markdown: string;
  svg: string;
  latest: string;
}

/**
 * Writes `<scenario>-<UTC stamp>.{json,md,svg}` and refreshes `latest-<scenario>.{md,svg}` in
 * `outDir`. The markdown links its chart by a relative name, so both can be moved together.
 */
export function writeResults(outDir: string, report: BenchReport): WrittenFiles {
  const dir = resolve(outDir);
  mkdirSync(dir, { recursive: true });
  const base = `${report.scenario}-${fileStamp(report.startedAt)}`;
  const render = (svgName: string): { markdown: string; svg: string } =>
    report.scenario === 'create' ? renderCreateReport(report, svgName) : renderExecReport(report, svgName);
  const files: WrittenFiles = {
    json: join(dir, `${base}.json`),
    markdown: join(dir, `${base}.md`),
    svg: join(dir, `${base}.svg`),
    latest: join(dir, `latest-${report.scenario}.md`),
  };
  writeFileSync(files.json, JSON.stringify(report, null, 2) + '\n');
  const own = render(`${base}.svg`);
  writeFileSync(files.markdown, own.markdown);
  writeFileSync(files.svg, own.svg);
  writeFileSync(files.latest, render(`latest-${report.scenario}.svg`).markdown);
  copyFileSync(files.svg, join(dir, `latest-${report.scenario}.svg`));
  return files;
}

/** Renders a saved JSON result again (after the report's format changed); refreshes latest-* only if asked. */
export function rerender(jsonFile: string, opts: { latest: boolean }): WrittenFiles {
  const report = JSON.parse(readFileSync(jsonFile, 'utf8')) as BenchReport;
  // Targets are a pure function of the measurements: judge them with today's rules.
  report.targets = report.scenario === 'create' ? createTargets(report.result) : execTargets(report.result);
  const dir = dirname(resolve(jsonFile));
  if (opts.latest) return writeResults(dir, report);
  const base = `${report.scenario}-${fileStamp(report.startedAt)}`;
  const own = report.scenario === 'create' ? renderCreateReport(report, `${base}.svg`) : renderExecReport(report, `${base}.svg`);
  const files = { json: resolve(jsonFile), markdown: join(dir, `${base}.md`), svg: join(dir, `${base}.svg`), latest: '' };
  writeFileSync(files.markdown, own.markdown);
  writeFileSync(files.svg, own.svg);
  return files;
}
