import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { writeResults, type WrittenFiles } from './report.js';
import { type BenchReport } from './result-types.js';
import { scenarioByName } from './scenarios/index.js';

/** Renders a saved JSON result again (after the report's format changed); refreshes latest-* only if asked. */
export function rerender(jsonFile: string, opts: { latest: boolean }): WrittenFiles {
  const report = JSON.parse(readFileSync(jsonFile, 'utf8')) as BenchReport;
  const def = scenarioByName(report.scenario);
  // Targets are a pure function of the measurements: judge them with today's rules.
  report.targets = def.targets(report.result);
  return writeResults(dirname(jsonFile), report, (r, svg) => def.render(r, svg), { latest: opts.latest, json: opts.latest });
}
