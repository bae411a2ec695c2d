/**
 * `dsec bench rollout`'s agent step, the same for every client: write a file (the agent's edit),
 * run 10 short commands over it (looking around, then a test run that checks the file and writes
 * a report, then two more), read the report back. Every step's file and sums differ, so a step
 * whose commands did not really run cannot print what `stepProblem` expects.
 */

/** Commands per step. */
export const COMMANDS_PER_STEP = 10;
/** Which of them is the test run (0-based). */
export const TEST_RUN_INDEX = 7;
/** Which prints the file's line count (checked too). */
const LINE_COUNT_INDEX = 3;

/** One step of one sandbox: what to write, the command lines (each run by a shell), what to read. */
export interface StepPlan {
  writePath: string;
  content: string;
  /** Shell command lines (`sh -c`, or E2B's `bash -l -c`); `commands[TEST_RUN_INDEX]` is the test run. */
  commands: string[];
  /** The test run's report. */
  readPath: string;
  /** What the test run prints (and writes to `readPath`) when the file is the one written. */
  expectTest: string;
  /** What the last command prints. */
  expectLast: string;
  lines: number;
}

/** What a client saw and how long each part took (ms). */
export interface StepOutcome {
  ms: number;
  writeMs: number;
  /** One per command, in order. */
  commandMs: number[];
  readMs: number;
  /** Each command's stdout, in order. */
  outputs: string[];
  read: string;
}

/** The step `step` of sandbox `sandbox` for `client` (its files are named by all three, so clients sharing a sandbox do not collide). */
export function stepPlan(client: string, sandbox: number, step: number): StepPlan {
  const tag = `${client.replace(/[^a-z0-9]+/gi, '-')}-${sandbox}-${step}`;
  const lines = 40 + ((sandbox * 7 + step * 13) % 40);
  const values = Array.from({ length: lines }, (_, i) => (i * 37 + step * 11 + sandbox) % 1000);
  const sum = values.reduce((a, b) => a + b, 0);
  const file = `/tmp/${tag}.txt`;
  const report = `/tmp/${tag}.report`;
  const commands = [
    'pwd',
    'ls /tmp | wc -l',
    `head -n 3 ${file}`,
    `wc -l < ${file}`,
    `grep -c 7 ${file}`,
    `sed -n 2,4p ${file}`,
    `sort -n ${file} | tail -n 1`,
    // The test run: checks the file's sum and length, writes its verdict to a report and prints it.
    `awk -v want=${sum} -v lines=${lines} '{ s += $1 } END { r = (s == want && NR == lines) ? "PASS" : "FAIL"; ` +
      `print r, NR, s > "${report}"; print r, NR, s; exit (r == "PASS" ? 0 : 1) }' ${file}`,
    `test -s ${report} && echo reported`,
    `echo done ${tag}`,
  ];
  return {
    writePath: file,
    content: values.join('\n') + '\n',
    commands,
    readPath: report,
    expectTest: `PASS ${lines} ${sum}\n`,
    expectLast: `done ${tag}\n`,
    lines,
  };
}

/** Why a step's outcome is not what its commands print when they ran on the file written, or undefined when it is. */
export function stepProblem(plan: StepPlan, outcome: StepOutcome): string | undefined {
  const o = outcome.outputs;
  if (o.length !== plan.commands.length) return `${o.length} command outputs for ${plan.commands.length} commands`;
  if (o[TEST_RUN_INDEX] !== plan.expectTest)
    return `the test run printed ${JSON.stringify(o[TEST_RUN_INDEX])}, not ${JSON.stringify(plan.expectTest)}`;
  if (o[LINE_COUNT_INDEX]?.trim() !== String(plan.lines)) return `wc -l printed ${JSON.stringify(o[LINE_COUNT_INDEX])}, not ${plan.lines}`;
  if (o[COMMANDS_PER_STEP - 1] !== plan.expectLast) return `the last command printed ${JSON.stringify(o[COMMANDS_PER_STEP - 1])}`;
  if (outcome.read !== plan.expectTest)
    return `the report read back is ${JSON.stringify(outcome.read)}, not ${JSON.stringify(plan.expectTest)}`;
  return undefined;
}

/** One sandbox as a client reaches it. `run` resolves with the command's stdout whatever its exit code. */
export interface StepTarget {
  write(path: string, content: string): Promise<void>;
  run(cmd: string): Promise<string>;
  read(path: string): Promise<string>;
}

/** One step through `target`, each call timed. */
export async function runStep(target: StepTarget, plan: StepPlan): Promise<StepOutcome> {
  const t0 = performance.now();
  await target.write(plan.writePath, plan.content);
  const writeMs = performance.now() - t0;
  const outputs: string[] = [];
  const commandMs: number[] = [];
  for (const cmd of plan.commands) {
    const t = performance.now();
    outputs.push(await target.run(cmd));
    commandMs.push(performance.now() - t);
  }
  const t1 = performance.now();
  const read = await target.read(plan.readPath);
  const t2 = performance.now();
  return { ms: t2 - t0, writeMs, commandMs, readMs: t2 - t1, outputs, read };
}

/** Each sandbox's steps or the error that ended one, per sandbox in order, and the wall time of all. */
export interface LoopsOutcome {
  wallMs: number;
  /** CPU time (user + system) of the client's own process over the run, where it has one of its own (the SDK clients). */
  clientCpuMs?: number;
  outcomes: (StepOutcome | { error: string })[][];
}

/** `plans[i]` on `targets[i]`, every sandbox at once, each its steps one after the other (an agent's loop). */
export async function runLoops(targets: StepTarget[], plans: StepPlan[][]): Promise<LoopsOutcome> {
  const t0 = performance.now();
  const outcomes = await Promise.all(
    targets.map(async (t, i) => {
      const out: LoopsOutcome['outcomes'][number] = [];
      for (const plan of plans[i] ?? []) {
        try {
          out.push(await runStep(t, plan));
        } catch (err) {
          out.push({ error: (err as Error).message });
        }
      }
      return out;
    }),
  );
  return { wallMs: performance.now() - t0, outcomes };
}
