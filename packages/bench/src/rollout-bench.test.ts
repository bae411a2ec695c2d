/** Unit tests of `dsec bench rollout`'s pure parts: the step, its check, the target, the flags. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { summarizeLatency } from './latency.js';
import { rolloutTargets } from './scenarios/rollout-report.js';
import type { RolloutResult, RolloutRun } from './scenarios/rollout-result.js';
import { rolloutScenario } from './scenarios/rollout.js';
import { COMMANDS_PER_STEP, stepPlan, stepProblem, TEST_RUN_INDEX, type StepOutcome, type StepPlan } from './scenarios/rollout-step.js';
import { defaultOptions } from './scenarios/scenario.js';

/** What a shell prints for each command of `plan` when the file is `plan.content`. */
function honest(plan: StepPlan): StepOutcome {
  const outputs = plan.commands.map(() => '');
  outputs[3] = `${plan.lines}\n`;
  outputs[TEST_RUN_INDEX] = plan.expectTest;
  outputs[COMMANDS_PER_STEP - 1] = plan.expectLast;
  return { ms: 1, writeMs: 0, commandMs: plan.commands.map(() => 0), readMs: 0, outputs, read: plan.expectTest };
}

describe('bench rollout step', () => {
  test('ten commands, the test run among them, and an answer that differs per client, sandbox and step', () => {
    const a = stepPlan('ts-sdk', 0, 1);
    assert.equal(a.commands.length, COMMANDS_PER_STEP);
    assert.match(a.commands[TEST_RUN_INDEX]!, /^awk /);
    const sum = a.content
      .trim()
      .split('\n')
      .reduce((s, x) => s + Number(x), 0);
    assert.equal(a.expectTest, `PASS ${a.lines} ${sum}\n`);
    assert.equal(a.content.trim().split('\n').length, a.lines);
    const b = stepPlan('ts-sdk', 0, 2);
    const c = stepPlan('python-sdk', 0, 1);
    assert.notEqual(a.expectTest, b.expectTest);
    assert.notEqual(a.writePath, c.writePath, 'clients sharing a sandbox write files of their own');
  });

  test('a step is verified only when its checked outputs are what its own file makes them', () => {
    const plan = stepPlan('e2b-sdk', 3, 5);
    assert.equal(stepProblem(plan, honest(plan)), undefined);
    const other = honest(stepPlan('e2b-sdk', 3, 6));
    assert.match(stepProblem(plan, other) ?? '', /test run printed/);
    const failing = honest(plan);
    failing.outputs[TEST_RUN_INDEX] = failing.outputs[TEST_RUN_INDEX]!.replace('PASS', 'FAIL');
    assert.match(stepProblem(plan, failing) ?? '', /test run printed "FAIL/);
    const unread = { ...honest(plan), read: '' };
    assert.match(stepProblem(plan, unread) ?? '', /report read back/);
    const short = { ...honest(plan), outputs: honest(plan).outputs.slice(0, 9) };
    assert.match(stepProblem(plan, short) ?? '', /9 command outputs/);
  });
});

describe('bench rollout target and flags', () => {
  const run = (client: RolloutRun['client'], sandboxes: number, stepsPerSecond: number): RolloutRun => ({
    client,
    sandboxes,
    stepsPerSandbox: 3,
    steps: 96,
    verified: 96,
    wrong: 0,
    failed: 0,
    seconds: 1,
    stepsPerSecond,
    clientCpuMsPerStep: null,
    step: summarizeLatency([1]),
    partsP50: { write: 1, command: 1, testRun: 1, read: 1 },
    problems: [],
  });
  const result = (runs: RolloutRun[], skipped: RolloutResult['skipped'] = []): RolloutResult => ({
    peers: [],
    dropped: [],
    clients: [],
    runs,
    skipped,
  });

  test('steps/s at 32 sandboxes against docker exec: met, missed, or not judged with why', () => {
    assert.equal(rolloutTargets(result([run('ts-sdk', 32, 90), run('docker exec', 32, 30)]))[0]!.ok, true);
    const missed = rolloutTargets(result([run('ts-sdk', 32, 60), run('docker exec', 32, 30)]))[0]!;
    assert.equal(missed.ok, false);
    assert.match(missed.measured, /= 2×/);
    const noDocker = rolloutTargets(result([run('ts-sdk', 32, 60)], [{ client: 'docker exec', reason: 'not installed: no dockerd' }]))[0]!;
    assert.equal(noDocker.ok, undefined);
    assert.match(noDocker.note, /not installed: no dockerd/);
    const no32 = rolloutTargets(result([run('ts-sdk', 1, 10), run('docker exec', 1, 5)]))[0]!;
    assert.equal(no32.ok, undefined);
    assert.match(no32.note, /not run at 32 sandboxes/);
  });

  test('--sandboxes is a list: 1, 32, 256 unless given', () => {
    assert.deepEqual(defaultOptions(rolloutScenario).sandboxes, [1, 32, 256]);
    assert.deepEqual(defaultOptions(rolloutScenario, { sandboxes: [1, 32] }).sandboxes, [1, 32]);
    assert.equal(rolloutScenario.maxSandboxes(defaultOptions(rolloutScenario, { sandboxes: [4, 2] })), 20);
  });
});
