/**
 * `dsec bench migrate` at CI size: `dsec control` and two `dsec edge` daemons, one round of each
 * container size (1 MiB and 2 MiB written), one move under each polling caller, a drain of 3; no
 * microVM (vm.test.ts and dsec's vm-migrate test boot those). Every move really happened — the
 * sandbox's edge changed, its data reads back with the checksum it had — no polled read failed, the
 * report has its shape and files, and the run leaves nothing behind. No figure is judged here: the full run
 * is `dsec bench migrate`.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { runBench, type BenchOutcome } from '../src/run-bench.js';
import { migrateScenario } from '../src/scenarios/migrate.js';
import type { MigrateResult } from '../src/scenarios/migrate-result.js';
import { defaultOptions } from '../src/scenarios/scenario.js';
import { integrationSkipReason } from './helpers/skip.js';

describe('dsec bench migrate (CI size)', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let out: string;
  let outcome: BenchOutcome;
  let r: MigrateResult;
  const other = (e: string): string => r.edges.find((x) => x !== e)!;

  before(async () => {
    out = mkdtempSync('/var/tmp/dsec-test-bench-migrate-');
    const options = defaultOptions(migrateScenario, {
      rounds: 1,
      smallMib: 1,
      largeMib: 2,
      vmMemoryMib: 0,
      pollMoves: 1,
      drainCount: 3,
    });
    outcome = await runBench({
      scenarios: [{ def: migrateScenario, options }],
      combined: false,
      peers: ['crun'],
      outDir: out,
      commandLine: 'test',
      nice: 0,
      say: () => {},
    });
    r = outcome.reports[0]!.report.result as MigrateResult;
  });

  after(() => {
    if (out) rmSync(out, { recursive: true, force: true });
  });

  test('each container moved to the other edge with its data intact', () => {
    assert.deepEqual(outcome.failed, []);
    assert.equal(r.edges.length, 2);
    assert.deepEqual(
      r.containers.map((s) => s.writtenMib),
      [1, 2],
    );
    for (const s of r.containers) {
      assert.deepEqual(s.errors, [], s.label);
      assert.equal(s.moves.length, 1, s.label);
      for (const m of s.moves) {
        assert.ok(r.edges.includes(m.from), `${s.label}: from ${m.from}`);
        assert.equal(m.to, other(m.from), `${s.label}: moved to the other edge`);
        assert.ok(m.edgeChanged, `${s.label}: its row names ${m.to}`);
        assert.ok(m.intact, `${s.label}: its data read back with the same md5 (${m.problem ?? ''})`);
        // Random data does not shrink: what moved is at least what was written.
        assert.ok(m.bytes >= s.writtenMib * 2 ** 20, `${s.label}: ${m.bytes} bytes moved`);
        for (const v of [m.ms, m.heldMs, m.callMs]) assert.ok(Number.isFinite(v) && v > 0, `${s.label}: ${v}`);
        assert.ok(m.heldMs <= m.ms, `${s.label}: held ${m.heldMs} within the move's ${m.ms} ms`);
      }
      assert.equal(s.verified, s.moves.length, s.label);
      assert.equal(s.ms.count, s.moves.length);
    }
    assert.ok('unavailable' in r.vm && /skipped/.test(r.vm.unavailable), JSON.stringify(r.vm));
  });

  test('a polling caller: each polled sandbox moved, intact, and kept being answered', () => {
    assert.deepEqual(
      r.downtime.map((d) => d.kind),
      ['exec true', 'file read'],
    );
    for (const d of r.downtime) {
      assert.equal(d.moves.length, 1, d.kind);
      assert.ok(d.calls >= 10, `${d.kind}: the caller kept calling (${d.calls} calls)`);
      for (const m of d.moves) {
        assert.equal(m.to, other(m.from), d.kind);
        assert.ok(m.edgeChanged && m.intact, `${d.kind}: moved and intact`);
        assert.ok(Number.isFinite(m.longestGapMs) && m.longestGapMs > 0, `${d.kind}: gap ${m.longestGapMs}`);
      }
    }
    const reads = r.downtime.find((d) => d.kind === 'file read')!;
    assert.equal(reads.failed, 0, `no read failed (${reads.failures.join('; ')})`);
  });

  // A command in flight at the quiesce makes it wait (or refuses the move): never killed by it (aced2d5).
  test('no polled exec fails during a move', () => {
    const execs = r.downtime.find((d) => d.kind === 'exec true')!;
    assert.equal(execs.failed, 0, execs.failures.join('; '));
  });

  test('a drain of 3: every sandbox moved to the other edge with its file', () => {
    assert.ok(!('unavailable' in r.drain), JSON.stringify(r.drain));
    if ('unavailable' in r.drain) return;
    const d = r.drain;
    assert.equal(d.count, 3);
    assert.equal(d.moved, 3, JSON.stringify(d.stayed));
    assert.deepEqual(d.stayed, []);
    assert.equal(d.verified, 3, `every drained sandbox is on the other edge with its file (${d.errors.join('; ')})`);
    assert.deepEqual(d.errors, []);
    assert.equal(d.perMove.count, 3);
    assert.ok(d.totalMs > 0);
  });

  test('the report: targets, files, markdown sections, nothing left behind', () => {
    const { report, files } = outcome.reports[0]!;
    assert.equal(report.targets.length, 3);
    assert.equal(report.targets[0]!.ok, undefined, 'not judged without a 10 MiB container');
    assert.equal(report.targets[1]!.ok, undefined, 'not judged without the VM');
    assert.equal(typeof report.targets[2]!.ok, 'boolean', 'no failed call: judged');
    assert.deepEqual(report.cleanup.leaks, []);
    assert.deepEqual(report.cleanup.errors, []);
    for (const f of [files.json, files.markdown, files.svg]) assert.ok(existsSync(f), f);
    const md = readFileSync(files.markdown, 'utf8');
    assert.match(md, /\| sandbox \| moves \| ms p50 \|/);
    assert.match(md, /## Downtime seen by a polling caller/);
    assert.match(md, /## Drain with migrate/);
    assert.match(md, /## Host and command/);
  });
});
