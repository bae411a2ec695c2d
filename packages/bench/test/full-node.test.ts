/**
 * A full node at CI size: `dsec bench density` fills the node with idle sandboxes (dsec and raw
 * crun, each in turn), times the next sandbox's create and exec at 0, 10, 50 and 100 % full, reads
 * memory per sandbox, removes them and leaves nothing behind. No figure is judged here (a shared
 * host is noisy); the full run is `dsec bench density -n 5000` (docs/RELIABILITY.md, "A full node").
 * `DSEC_SOAK=1` fills to 1,000; `DSEC_FULL_NODE_COUNT` sets the size.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { describe, test } from 'node:test';
import { runBench } from '../src/run-bench.js';
import { densityScenario, type DensityResult } from '../src/scenarios/density.js';
import { defaultOptions } from '../src/scenarios/scenario.js';
import { integrationSkipReason } from './helpers/skip.js';

const count = Number(process.env['DSEC_FULL_NODE_COUNT'] ?? (process.env['DSEC_SOAK'] === '1' ? 1000 : 100));

describe('a full node (dsec bench density, CI size)', { skip: integrationSkipReason(), timeout: 1_800_000 }, () => {
  test(`${count} idle sandboxes per peer: the next sandbox timed at 0/10/50/100 %, memory per sandbox, nothing left`, async () => {
    const out = mkdtempSync('/var/tmp/dsec-test-full-node-');
    try {
      const options = defaultOptions(densityScenario, { count, concurrency: 4, settleMs: 500, probes: 2, minAvailableMiB: 2048 });
      const outcome = await runBench({
        scenarios: [{ def: densityScenario, options }],
        combined: false,
        peers: ['crun'],
        outDir: out,
        commandLine: 'test',
        nice: 0,
        say: () => {},
      });
      assert.deepEqual(outcome.failed, []);
      const { report, files } = outcome.reports[0]!;
      const result = report.result as DensityResult;
      assert.deepEqual(
        result.peers.map((p) => p.name),
        ['dsec', 'crun'],
      );
      for (const p of result.peers) {
        assert.deepEqual(p.errors, [], p.name);
        assert.equal(p.stoppedEarly, undefined, p.name);
        assert.equal(p.sandboxes, count, p.name);
        assert.deepEqual(
          p.curve.map((c) => c.held),
          [0, count / 10, count / 2, count].map(Math.round),
          p.name,
        );
        for (const c of p.curve) {
          assert.equal(c.create.count, 2, `${p.name} at ${c.held}`);
          assert.equal(c.exec.count, 2, `${p.name} at ${c.held}`);
        }
        assert.ok(p.perSandbox.cgroupChargedKiB > 0, `${p.name}: its sandboxes' cgroups were read`);
      }
      // The node holds dsec's sandboxes: its mounts grow with them (an overlay and a layer mount each, the layer shared).
      const dsec = result.peers[0]!;
      assert.ok(dsec.curve.at(-1)!.mounts >= dsec.curve[0]!.mounts + count, `mounts ${dsec.curve.map((c) => c.mounts).join(' → ')}`);
      assert.equal(report.targets.length, 4);
      assert.deepEqual(report.cleanup.leaks, []);
      assert.deepEqual(report.cleanup.errors, []);
      for (const f of [files.json, files.markdown]) assert.ok(existsSync(f), f);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
