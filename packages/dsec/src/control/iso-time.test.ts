import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isoTime } from './iso-time.js';

test('isoTime is Date.toISOString of the millisecond asked for, also when one comes back after another', () => {
  for (const ms of [0, 1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_000, 1_700_000_000_999, 1_700_000_001_000]) {
    assert.equal(isoTime(ms), new Date(ms).toISOString());
  }
});

test("isoTime without an argument is now's", (t) => {
  t.mock.method(Date, 'now', () => 1_234_567_890_123);
  assert.equal(isoTime(), '2009-02-13T23:31:30.123Z');
});
