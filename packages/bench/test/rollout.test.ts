/**
 * `dsec bench rollout` at CI size: 1 and 2 sandboxes, 2 steps each, through every client that can
 * run here (the TS SDK, also as E2B's SDK runs commands, the Python SDK, E2B's SDK, raw `crun
 * exec`; docker and podman where they are installed). Every step's commands really ran — the test run's verdict, the line count, the
 * last echo and the report read back are checked against what that step's own file makes them
 * print — the report has its shape and files, and the run leaves nothing behind. No figure is
 * judged here: the full sweep (1, 32, 256 sandboxes) is `dsec bench rollout`.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { describe, test } from 'node:test';
import { runBench } from '../src/run-bench.js';
import { rolloutScenario } from '../src/scenarios/rollout.js';
import type { RolloutResult } from '../src/scenarios/rollout-result.js';
import { defaultOptions } from '../src/scenarios/scenario.js';
import { integrationSkipReason } from './helpers/skip.js';

describe('dsec bench rollout (CI size)', { skip: integrationSkipReason(), timeout: 900_000 }, () => {
  test('every client at 1 and 2 sandboxes: each step verified, report and files, nothing left', async () => {
    const out = mkdtempSync('/var/tmp/dsec-test-bench-rollout-');
    try {
      const options = defaultOptions(rolloutScenario, { sandboxes: [1, 2], steps: 2, minSteps: 2, rounds: 2 });
      const outcome = await runBench({
        scenarios: [{ def: rolloutScenario, options }],
        combined: false,
        peers: ['crun'],
        outDir: out,
        commandLine: 'test',
        nice: 0,
        say: () => {},
      });
      assert.deepEqual(outcome.failed, []);
      const { report, files } = outcome.reports[0]!;
      const result = report.result as RolloutResult;
      // Where python3 and the e2b package are (this suite's host), their clients run; a client
      // that did not run must say why, and the TS SDK and raw crun always run.
      const ran = new Set(result.runs.map((r) => r.client));
      for (const client of ['ts-sdk', 'crun exec'] as const) assert.ok(ran.has(client), `${client} ran`);
      if (existsSync('/usr/bin/python3')) assert.ok(ran.has('python-sdk'), JSON.stringify(result.skipped));
      assert.ok(ran.has('e2b-sdk'), JSON.stringify(result.skipped));
      assert.ok(ran.has('ts-sdk bash -l'), JSON.stringify(result.skipped));
      for (const s of result.skipped) assert.ok(s.reason.length > 0, s.client);
      for (const client of ran)
        assert.deepEqual(
          result.runs.filter((r) => r.client === client).map((r) => r.sandboxes),
          [1, 2],
          client,
        );
      for (const r of result.runs) {
        const at = `${r.client} at ${r.sandboxes}`;
        assert.equal(r.stepsPerSandbox, 2, at);
        assert.equal(r.steps, r.sandboxes * 2, `${at}: every timed step ran to the end (${r.problems.join('; ')})`);
        assert.equal(r.failed, 0, at);
        assert.equal(r.wrong, 0, `${at}: ${r.problems.join('; ')}`);
        assert.equal(r.verified, r.steps, at);
        assert.deepEqual(r.problems, [], at);
        assert.equal(r.step.count, r.steps, at);
        // The SDK clients run in processes of their own, whose CPU time is reported; a runtime's exec has none.
        if (r.client.endsWith(' exec')) assert.equal(r.clientCpuMsPerStep, null, at);
        else assert.ok(r.clientCpuMsPerStep !== null && r.clientCpuMsPerStep > 0, `${at}: client CPU ${r.clientCpuMsPerStep}`);
        for (const v of [
          r.stepsPerSecond,
          r.step.p50,
          r.step.p99,
          r.partsP50.write,
          r.partsP50.command,
          r.partsP50.testRun,
          r.partsP50.read,
        ])
          assert.ok(Number.isFinite(v) && v > 0, `${at}: ${v}`);
      }
      // docker and podman run wherever installed; elsewhere the report says why.
      for (const peer of ['docker', 'podman'] as const)
        assert.ok(
          ran.has(`${peer} exec`) || report.unavailable.some((u) => u.name === peer && u.reason),
          `${peer}: neither run nor reported (${JSON.stringify(report.unavailable)})`,
        );
      assert.equal(report.targets.length, 1);
      assert.equal(report.targets[0]!.ok, undefined, 'not judged without 32 sandboxes');
      assert.deepEqual(report.cleanup.leaks, []);
      assert.deepEqual(report.cleanup.errors, []);
      for (const f of [files.json, files.markdown, files.svg]) assert.ok(existsSync(f), f);
      const md = readFileSync(files.markdown, 'utf8');
      assert.match(md, /\| sandboxes \| client \| steps \| steps\/s \|/);
      assert.match(md, /## Host and command/);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
