import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { BenchReport, RenderReport } from './result-types.js';

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
 * `outDir` (unless `latest` is false). The markdown links its chart by a relative name, so both
 * can be moved together.
 */
export function writeResults(
  outDir: string,
  report: BenchReport,
  render: RenderReport,
  opts: { latest?: boolean; json?: boolean } = {},
): WrittenFiles {
  const dir = resolve(outDir);
  mkdirSync(dir, { recursive: true });
  const base = `${report.scenario}-${fileStamp(report.startedAt)}`;
  const files: WrittenFiles = {
    json: join(dir, `${base}.json`),
    markdown: join(dir, `${base}.md`),
    svg: join(dir, `${base}.svg`),
    latest: opts.latest === false ? '' : join(dir, `latest-${report.scenario}.md`),
  };
  if (opts.json !== false) writeFileSync(files.json, JSON.stringify(report, null, 2) + '\n');
  const own = render(report, `${base}.svg`);
  writeFileSync(files.markdown, own.markdown);
  writeFileSync(files.svg, own.svg);
  if (files.latest) {
    writeFileSync(files.latest, render(report, `latest-${report.scenario}.svg`).markdown);
    copyFileSync(files.svg, join(dir, `latest-${report.scenario}.svg`));
  }
  return files;
}
