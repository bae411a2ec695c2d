/**
 * The kill -9 soak's accounting (sandbox-ledger.ts) on made-up lists: it must call a sandbox lost
 * or unaccounted when it is, or the soak's "none lost" could never fail.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { SandboxLedger } from './sandbox-ledger.js';

const info = (id: string, status: SandboxInfo['status'], reason?: string): SandboxInfo =>
  ({ id, status, ...(reason ? { reason } : {}) }) as SandboxInfo;

describe('sandbox ledger', () => {
  test('accepted sandboxes are running, failed with a reason, gone as asked, or lost', () => {
    const l = new SandboxLedger();
    for (const id of ['a', 'b', 'c', 'd', 'e', 'f']) l.track.created!(id);
    l.track.killing!('c'); // its kill's answer cut: gone as asked
    l.track.killing!('f');
    l.track.killed!('f'); // answered: gone before the crash
    const acc = l.account([
      info('a', 'running'),
      info('b', 'failed', 'its edge did not have it'),
      info('e', 'paused'),
      info('x', 'failed', 'cut'),
    ]);
    assert.deepEqual(
      { ...acc, reasons: acc.reasons.length },
      {
        outstanding: 5,
        running: 1,
        paused: 1,
        failedWithReason: 2,
        reasons: 2,
        killedAtCrash: 1,
        unacknowledged: 1,
        lost: ['d'],
        unaccounted: [],
      },
    );
    // The lost one is reported once; the listed ones stay outstanding until killed.
    assert.deepEqual(l.outstanding.sort(), ['a', 'b', 'e']);
    for (const id of ['a', 'b', 'e', 'x']) l.gone(id);
    assert.deepEqual(l.outstanding, []);
  });

  test('a failure without a reason, a sandbox stuck creating, and one listed after its kill was answered are unaccounted', () => {
    const l = new SandboxLedger();
    for (const id of ['a', 'b', 'c']) l.track.created!(id);
    l.track.killing!('c');
    l.track.killed!('c');
    const acc = l.account([info('a', 'failed'), info('b', 'creating'), info('c', 'running')]);
    assert.deepEqual(acc.unaccounted, ['a: failed', 'b: creating', 'c: listed as running after its kill was answered']);
    assert.deepEqual(acc.lost, []);
  });
});
