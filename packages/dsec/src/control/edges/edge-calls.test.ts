import assert from 'node:assert/strict';
import { test } from 'node:test';
import { EdgeCalls } from './edge-calls.js';

test('a call is in flight from its start until it settles or ends, whichever way it ends', () => {
  const calls = new EdgeCalls();
  const reason = new Error('gone before the call');
  const early = calls.start(60_000, AbortSignal.abort(reason));
  assert.equal(early.ended?.why, 'caller');
  assert.equal(early.ended?.reason, reason);
  assert.equal(calls.size, 0, 'a call whose caller had already aborted is not left in flight');

  const ctrl = new AbortController();
  const settled = calls.start(60_000, ctrl.signal);
  const lost = calls.start(undefined, undefined);
  assert.equal(calls.size, 2);
  settled.done();
  assert.equal(calls.size, 1);
  ctrl.abort(new Error('after it settled'));
  assert.equal(settled.ended, undefined, 'a settled call no longer hears its caller');
  calls.endAll();
  assert.equal(lost.ended?.why, 'lost');
  assert.equal(calls.size, 0);
});
