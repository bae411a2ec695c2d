/**
 * `dsec bench fncall` at CI size: every way (host python3, crun run per call, a dsec sandbox per
 * call, fn/run) runs the reward function for real at concurrency 1 and 8 and answers right, the
 * pool claims are timed, the report and its files are written and the run leaves nothing behind.
 * No figure is judged here: the full run (1,000 calls, concurrency 32) is `dsec bench fncall`.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { describe, test } from 'node:test';
import { runBench } from '../src/run-bench.js';
import { fnCallScenario, type FnCallResult } from '../src/scenarios/fncall.js';
import { defaultOptions } from '../src/scenarios/scenario.js';
import { integrationSkipReason } from './helpers/skip.js';

const skip =
  integrationSkipReason() ?? (existsSync('/usr/bin/python3') ? undefined : 'the fncall benchmark needs /usr/bin/python3 on the host');

describe('dsec bench fncall (CI size)', { skip, timeout: 900_000 }, () => {
  test('four ways at concurrency 1 and 8, right answers, pool claims, result files, nothing left', async () => {
    const out = mkdtempSync('/var/tmp/dsec-test-bench-fncall-');
    try {
      const options = defaultOptions(fnCallScenario, { count: 4, perCallCount: 2, claims: 8, maxConcurrency: 8 });
      const outcome = await runBench({
        scenarios: [{ def: fnCallScenario, options }],
        combined: false,
        peers: ['crun'],
        outDir: out,
        commandLine: 'test',
        nice: 0,
        say: () => {},
      });
      assert.deepEqual(outcome.failed, []);
      const { report, files } = outcome.reports[0]!;
      const result = report.result as FnCallResult;
      const runs = result.peers[0]!.runs;
      assert.deepEqual(runs.map((r) => `${r.way}@${r.concurrency}`).sort(), [
        'crun@1',
        'crun@8',
        'fn@1',
        'fn@8',
        'host@1',
        'host@8',
        'sandbox@1',
        'sandbox@8',
      ]);
      for (const r of runs) {
        assert.deepEqual(r.errors, [], `${r.way}@${r.concurrency}`);
        assert.equal(r.wrong, 0, `${r.way}@${r.concurrency} answered wrong`);
        assert.equal(r.calls, r.way === 'crun' || r.way === 'sandbox' ? 2 : 4);
      }
      assert.equal(result.peers[0]!.poolClaim.count, 8);
      assert.equal(report.targets.length, 4);
      assert.deepEqual(report.cleanup.leaks, []);
      assert.deepEqual(report.cleanup.errors, []);
      for (const f of [files.json, files.markdown]) assert.ok(existsSync(f), f);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
