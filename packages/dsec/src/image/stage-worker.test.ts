import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { DEFAULT_DIFF_LIMITS, DiffLimitError } from './pack-diff.js';
import { DiffCancelledError, KEPT_IDLE, stageThreadsIdle, stageThreadsStarted, stageUpperDiffOffThread } from './stage-worker.js';

const root = mkdtempSync(join(tmpdir(), 'dsec-stage-worker-test-'));
after(() => rmSync(root, { recursive: true, force: true }));

let n = 0;
function upperWith(files: number): { upper: string; stage: string } {
  const dir = join(root, String(n++));
  const upper = join(dir, 'upper');
  mkdirSync(join(upper, 'd'), { recursive: true });
  for (let i = 0; i < files; i++) writeFileSync(join(upper, 'd', `f${i}`), `file ${i}`);
  const stage = join(dir, 'stage');
  mkdirSync(stage);
  return { upper, stage };
}

const copy = (u: { upper: string; stage: string }, o: { signal?: AbortSignal; maxEntries?: number } = {}) =>
  stageUpperDiffOffThread(
    u.upper,
    u.stage,
    [],
    { ...DEFAULT_DIFF_LIMITS, maxEntries: o.maxEntries ?? DEFAULT_DIFF_LIMITS.maxEntries },
    { timeoutMs: 60_000, signal: o.signal },
  );

test('copies one after another run on one thread: a snapshot starts no thread of its own', async () => {
  const before = stageThreadsStarted();
  for (let i = 0; i < 5; i++) {
    const u = upperWith(3);
    const stats = await copy(u);
    assert.equal(stats.entries, 4);
    assert.equal(readFileSync(join(u.stage, 'd', 'f2'), 'utf8'), 'file 2');
  }
  assert.ok(stageThreadsStarted() - before <= 1, `${stageThreadsStarted() - before} threads started for 5 copies in turn`);
});

test('copies at once each get a thread; afterwards at most KEPT_IDLE stay, and a limit error does not lose its thread', async () => {
  const results = await Promise.all([upperWith(2), upperWith(2), upperWith(2), upperWith(2)].map((u) => copy(u)));
  assert.deepEqual(
    results.map((r) => r.entries),
    [3, 3, 3, 3],
  );
  const before = stageThreadsStarted();
  await assert.rejects(copy(upperWith(5), { maxEntries: 2 }), DiffLimitError);
  await Promise.all(Array.from({ length: KEPT_IDLE }, () => copy(upperWith(1))));
  assert.equal(stageThreadsStarted(), before, 'the kept threads served the next copies');
});

test('a cancelled copy rejects with DiffCancelledError, its thread ends, and the next copy still works', async () => {
  const ac = new AbortController();
  ac.abort();
  await assert.rejects(copy(upperWith(1), { signal: ac.signal }), DiffCancelledError);
  const big = upperWith(3000);
  const idleBefore = stageThreadsIdle();
  const midway = new AbortController();
  const p = copy(big, { signal: midway.signal });
  setTimeout(() => midway.abort(), 5);
  await assert.rejects(p, DiffCancelledError);
  assert.equal(stageThreadsIdle(), Math.max(0, idleBefore - 1), "the stopped copy's thread went back to the idle set");
  const slow = upperWith(3000);
  const timedOut = stageUpperDiffOffThread(slow.upper, slow.stage, [], DEFAULT_DIFF_LIMITS, { timeoutMs: 1 });
  await assert.rejects(timedOut, DiffLimitError);
  assert.equal(stageThreadsIdle(), Math.max(0, idleBefore - 2), "the timed-out copy's thread went back to the idle set");
  assert.equal((await copy(upperWith(2))).entries, 3);
});
