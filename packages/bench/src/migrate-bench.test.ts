/** Unit tests of `dsec bench migrate`'s pure parts: its targets, its rendering, its flags. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { summarizeLatency } from './latency.js';
import type { BenchReport } from './result-types.js';
import { migrateLines, migrateTargets, renderMigrate } from './scenarios/migrate-report.js';
import type { DowntimeRun, MigrateResult, MoveRecord, MoveSet } from './scenarios/migrate-result.js';
import { migrateScenario } from './scenarios/migrate.js';
import { defaultOptions } from './scenarios/scenario.js';

function set(writtenMib: number, ms: number[], backend: MoveSet['backend'] = 'container', memoryMiB = 128): MoveSet {
  const moves: MoveRecord[] = ms.map((m, i) => ({
    id: `sb-x-${i}`,
    from: i % 2 ? 'b' : 'a',
    to: i % 2 ? 'a' : 'b',
    ms: m,
    heldMs: m - 5,
    callMs: m + 2,
    bytes: writtenMib * 2 ** 20,
    edgeChanged: true,
    intact: true,
  }));
  return {
    label: `${backend} ${writtenMib}`,
    backend,
    writtenMib,
    memoryMiB,
    moves,
    ms: summarizeLatency(ms),
    heldMs: summarizeLatency(ms.map((m) => m - 5)),
    callMs: summarizeLatency(ms.map((m) => m + 2)),
    bytesP50: writtenMib * 2 ** 20,
    verified: moves.length,
    errors: [],
  };
}

function polled(kind: DowntimeRun['kind'], failures: string[]): DowntimeRun {
  const move = {
    from: 'a',
    to: 'b',
    ms: 300,
    heldMs: 290,
    longestGapMs: 340,
    slowestCallMs: 300,
    calls: 20,
    failed: failures.length,
    refused: 0,
  };
  return {
    kind,
    moves: [{ ...move, edgeChanged: true, intact: true }],
    longestGapMs: summarizeLatency([340]),
    calls: 20,
    failed: failures.length,
    failures,
    refused: 0,
  };
}

function result(over: Partial<MigrateResult> = {}): MigrateResult {
  return {
    peers: [{ name: 'dsec', description: 'd', version: 'v', errors: [] }],
    dropped: [],
    edges: ['a', 'b'],
    layout: 'two edges',
    containers: [set(10, [400, 300, 500]), set(500, [11000, 12000, 13000])],
    vm: set(32, [3900, 3000, 4100], 'microvm', 256),
    vmAccel: 'TCG (no KVM here)',
    downtime: [polled('exec true', []), polled('file read', [])],
    drain: {
      count: 100,
      fillMoves: 50,
      fillMs: summarizeLatency([200, 300]),
      totalMs: 5200,
      perMove: summarizeLatency([150, 180, 500]),
      moved: 100,
      stayed: [],
      nodeState: 'draining',
      verified: 100,
      errors: [],
    },
    ...over,
  };
}

describe('bench migrate targets', () => {
  test('10 MiB under 1 s and a 256 MiB microVM under 5 s under TCG, judged on the p50 of ms; no failed call', () => {
    const t = migrateTargets(result());
    assert.deepEqual(
      t.map((x) => x.ok),
      [true, true, true],
    );
    assert.match(t[0]!.measured, /^400 ms p50 over 3 moves/);
    assert.match(t[1]!.measured, /^3900 ms p50 over 3 moves \(TCG/);
    const slow = migrateTargets(result({ containers: [set(10, [1200, 1100, 900])], downtime: [polled('exec true', ['true exited 137'])] }));
    assert.equal(slow[0]!.ok, false);
    assert.equal(slow[2]!.ok, false);
    assert.match(slow[2]!.note, /exited 137/);
  });

  test('not judged without a 10 MiB container, without the VM, at another guest size; noted under KVM', () => {
    const t = migrateTargets(result({ containers: [set(1, [100])], vm: { unavailable: 'no qemu' }, downtime: [] }));
    assert.equal(t.length, 2, 'no calls judged without a polling caller');
    assert.equal(t[0]!.ok, undefined);
    assert.equal(t[1]!.ok, undefined);
    assert.equal(t[1]!.note, 'no qemu');
    assert.equal(migrateTargets(result({ vm: set(32, [3000], 'microvm', 512) }))[1]!.ok, undefined);
    assert.match(migrateTargets(result({ vmAccel: 'KVM (boots)' }))[1]!.note, /under KVM, not TCG/);
  });
});

describe('bench migrate report', () => {
  test('renders every section, and without the VM and the drain', () => {
    const base = {
      scenario: 'migrate',
      startedAt: 's',
      finishedAt: 'f',
      loadAverage1mAtEnd: 1,
      options: defaultOptions(migrateScenario) as unknown as Record<string, unknown>,
      unavailable: [],
      profile: [],
      notInstrumented: [],
      cleanup: { errors: [], leaks: [] },
      host: {
        commandLine: 'dsec bench migrate',
        os: 'Debian',
        kernel: 'k',
        cpus: 2,
        cpuModel: 'cpu',
        memTotalMiB: 1,
        loadAverage1m: 1,
        node: 'v20',
        dsec: 'x',
      },
    };
    const full = result();
    const { markdown, svg } = renderMigrate(
      { ...base, result: full, targets: migrateTargets(full) } as unknown as BenchReport<MigrateResult>,
      'm.svg',
    );
    assert.match(markdown, /\| container 10 \| 3 \| 400 \|/);
    assert.match(markdown, /## Downtime seen by a polling caller/);
    assert.match(markdown, /\| 100 \| 100 \| 0 \| 5.2 \|/);
    assert.match(svg, /^<svg /);
    const bare = result({ vm: { unavailable: 'no qemu' }, drain: { unavailable: 'skipped (--drain-count 0)' }, downtime: [] });
    const r2 = renderMigrate({ ...base, result: bare, targets: migrateTargets(bare) } as unknown as BenchReport<MigrateResult>, 'm.svg');
    assert.match(r2.markdown, /microVM: not measured: no qemu/);
    assert.match(r2.markdown, /Not run: skipped/);
    assert.ok(migrateLines(bare).some((l) => /drain not run/.test(l)));
  });

  test("the defaults are the issue's: 10 and 500 MiB, a 256 MiB microVM, 50 ms polls, a drain of 100", () => {
    const o = defaultOptions(migrateScenario);
    assert.deepEqual([o.smallMib, o.largeMib, o.vmMemoryMib, o.pollMs, o.drainCount], [10, 500, 256, 50, 100]);
  });
});
