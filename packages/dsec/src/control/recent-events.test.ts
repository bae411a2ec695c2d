import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RecentEvents } from './recent-events.js';

test('recent events: the last minute counted, older seconds dropped, a bucket reused after a minute starts over', () => {
  const r = new RecentEvents();
  const t0 = 1_000_000_000;
  r.add(1, t0);
  r.add(2, t0 + 500);
  r.add(1, t0 + 30_000);
  assert.equal(r.total(t0 + 30_000), 4);
  assert.equal(r.total(t0 + 59_999), 4, 'the first second is still inside the window');
  assert.equal(r.total(t0 + 60_000), 1, 'a minute later the first second has left it');
  r.add(5, t0 + 60_000); // the same bucket as t0's second: it starts over
  assert.equal(r.total(t0 + 60_000), 6);
  assert.equal(r.total(t0 + 200_000), 0, 'nothing for minutes: nothing counted');
});
