import { renderChart } from '../chart-svg.js';
import { mdTable, ratio } from '../markdown.js';
import type { BenchReport } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { round } from '../stats.js';
import { TARGETS, type TargetCheck } from '../targets.js';
import type { RolloutClientName } from './rollout-clients.js';
import type { RolloutOptions, RolloutResult, RolloutRun } from './rollout-result.js';
import { COMMANDS_PER_STEP, TEST_RUN_INDEX } from './rollout-step.js';

type RolloutReport = BenchReport<RolloutResult>;

/** The size the issue's target is read at. */
const TARGET_SANDBOXES = 32;

function runOf(r: RolloutResult, client: RolloutClientName, sandboxes: number): RolloutRun | undefined {
  return r.runs.find((x) => x.client === client && x.sandboxes === sandboxes);
}

/** Why `client` has no figure at `sandboxes`: what the run recorded, or that the size was not run. */
function whyMissing(r: RolloutResult, client: RolloutClientName, sandboxes: number, peer?: string): string {
  const skip = r.skipped.find((s) => s.client === client && (s.sandboxes === undefined || s.sandboxes === sandboxes));
  if (skip) return `${client} did not run: ${skip.reason}`;
  if (!r.runs.some((x) => x.sandboxes === sandboxes)) return `not run at ${sandboxes} sandboxes (--sandboxes)`;
  return `${client} did not run${peer ? ` (not asked for: --peers ${peer})` : ''}`;
}

/** Issue 32: steps/s at 32 sandboxes through the TS SDK ≥ 3× docker exec's, same run. */
export function rolloutTargets(r: RolloutResult): TargetCheck[] {
  const target = `rollout steps/s at ${TARGET_SANDBOXES} sandboxes ≥ ${TARGETS.rolloutVsDocker}× docker exec's (issue 32)`;
  const ts = runOf(r, 'ts-sdk', TARGET_SANDBOXES);
  const docker = runOf(r, 'docker exec', TARGET_SANDBOXES);
  if (!ts || !docker) {
    const note = !ts ? whyMissing(r, 'ts-sdk', TARGET_SANDBOXES) : whyMissing(r, 'docker exec', TARGET_SANDBOXES, 'docker');
    return [{ target, measured: ts ? `ts-sdk ${ts.stepsPerSecond} steps/s; docker exec n/a` : 'n/a', ok: undefined, note }];
  }
  const x = ts.stepsPerSecond / docker.stepsPerSecond;
  const ok = x >= TARGETS.rolloutVsDocker;
  return [
    {
      target,
      measured: `ts-sdk ${ts.stepsPerSecond} vs docker exec ${docker.stepsPerSecond} steps/s = ${round(x, 2)}×`,
      ok,
      note: ok ? `met, ${round(x - TARGETS.rolloutVsDocker, 2)}× of headroom` : `missed by ${round(TARGETS.rolloutVsDocker - x, 2)}×`,
    },
  ];
}

function sizes(r: RolloutResult): number[] {
  return [...new Set(r.runs.map((x) => x.sandboxes))].sort((a, b) => a - b);
}

function rows(r: RolloutResult): (string | number)[][] {
  const out: (string | number)[][] = [];
  for (const n of sizes(r)) {
    const docker = runOf(r, 'docker exec', n);
    const crun = runOf(r, 'crun exec', n);
    for (const x of r.runs.filter((y) => y.sandboxes === n)) {
      out.push([
        n,
        x.client,
        x.steps,
        x.stepsPerSecond,
        docker ? ratio(x.stepsPerSecond, docker.stepsPerSecond) : 'n/a',
        crun ? ratio(x.stepsPerSecond, crun.stepsPerSecond) : 'n/a',
        x.step.p50,
        x.step.p99,
        x.partsP50.write,
        x.partsP50.command,
        x.partsP50.testRun,
        x.partsP50.read,
        x.clientCpuMsPerStep ?? 'n/a',
        `${x.verified}/${x.steps}`,
        x.failed,
      ]);
    }
  }
  return out;
}

export function renderRollout(report: RolloutReport, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as RolloutOptions;
  const svg = renderChart(
    `dsec bench rollout — ${report.startedAt}`,
    chartSubtitle(report),
    sizes(result).map((n) => ({
      title: `steps/s at ${n} sandbox${n === 1 ? '' : 'es'}`,
      unit: 'steps/s',
      better: 'higher' as const,
      bars: result.runs.filter((x) => x.sandboxes === n).map((x) => ({ label: x.client, value: x.stepsPerSecond })),
    })),
  );
  const problems = result.runs.filter((x) => x.problems.length);
  const md = [
    `# dsec bench rollout — ${report.startedAt}`,
    '',
    `An agent's step in each of N sandboxes at once (N = ${o.sandboxes.join(', ')}), each sandbox its steps one after the other: ` +
      `write a file (40–79 numbers), run ${COMMANDS_PER_STEP} short commands over it (\`pwd\`, \`ls | wc\`, \`head\`, \`wc -l\`, \`grep -c\`, \`sed -n\`, ` +
      `\`sort | tail\`, the test run — an awk script checking the file's sum and length that writes a PASS/FAIL report — \`test -s\` and \`echo\`), ` +
      `read the report back. Every step's outputs are checked (the test run's verdict, the line count, the last echo, the report read back), ` +
      `so a step that did not run its commands cannot count as verified. At least ${o.steps} timed steps per sandbox and ${o.minSteps} per client and size, ` +
      `in ${o.rounds} rounds with the clients alternating, after one untimed step per sandbox. Steps/s is steps finished ÷ the wall time of the timed runs, ` +
      `all sandboxes together; latency is one step, write to read back.`,
    '',
    ...result.clients.map((c) => `- **${c.client}** (${c.image} image): ${c.description}`),
    '',
    mdTable(
      [
        'sandboxes',
        'client',
        'steps',
        'steps/s',
        '÷ docker exec',
        '÷ crun exec',
        'step p50 (ms)',
        'step p99 (ms)',
        'write p50',
        'command p50',
        'test run p50',
        'read p50',
        'client CPU/step (ms)',
        'verified',
        'failed',
      ],
      rows(result),
    ),
    '',
    `"÷ docker exec" and "÷ crun exec" are this client's steps/s over theirs at the same size. "command p50" is one of the ${COMMANDS_PER_STEP - 1} ` +
      `commands other than the test run (command ${TEST_RUN_INDEX + 1} of ${COMMANDS_PER_STEP}). "client CPU/step" is the CPU time (user + system) of the ` +
      `SDK client's own process per step, what the trainer's side costs. The E2B SDK needs bash (it runs every command as \`bash -l -c\`), ` +
      `so its sandboxes run E2B's \`base\` template (Debian minbase, bash, python3) where the others run busybox: its figures carry a login shell ` +
      `and Debian's dynamically linked tools as well as E2B's protocol. **ts-sdk bash -l** places the difference: dsec's SDK on the same template ` +
      `running each command the way E2B's SDK does, so e2b-sdk − ts-sdk bash -l is E2B's protocol and SDK, and ts-sdk bash -l − ts-sdk the login shell and the image.`,
    '',
  ];
  // A runtime that did not run at all is listed with the peers that did not, below.
  const skipped = result.skipped.filter((s) => s.sandboxes !== undefined || !s.client.endsWith(' exec'));
  if (skipped.length) {
    md.push('**Clients that did not run:**', '');
    for (const s of skipped) md.push(`- **${s.client}**${s.sandboxes ? ` at ${s.sandboxes}` : ''}: ${s.reason}`);
    md.push('');
  }
  if (problems.length) {
    md.push('**Wrong answers and failures (first few per run):**', '');
    for (const x of problems) for (const p of x.problems) md.push(`- ${x.client} at ${x.sandboxes}: ${p}`);
    md.push('');
  }
  md.push(...renderCommon(report, svgName));
  return { markdown: md.join('\n'), svg };
}

export function rolloutLines(r: RolloutResult): string[] {
  return [
    ...r.runs.map(
      (x) =>
        `${String(x.sandboxes).padStart(4)} sb ${x.client.padEnd(12)} ${String(x.stepsPerSecond).padStart(8)} steps/s  step p50 ${x.step.p50} ms  p99 ${x.step.p99} ms  verified ${x.verified}/${x.steps}${x.failed ? `  ${x.failed} failed` : ''}`,
    ),
    ...r.skipped
      .filter((s) => s.sandboxes !== undefined || !s.client.endsWith(' exec'))
      .map((s) => `${s.client} did not run${s.sandboxes ? ` at ${s.sandboxes}` : ''}: ${s.reason}`),
  ];
}
