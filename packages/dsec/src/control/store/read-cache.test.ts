import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ChangeFeed } from './change-feed.js';
import { ReadCache } from './read-cache.js';

/** A feed the test drives: live or not, and changes announced by hand. */
function fakeFeed(): ChangeFeed & { live: boolean; announce(topic: string): void } {
  const listeners: ((t: string) => void)[] = [];
  return {
    live: true,
    subscribe: (l) => void listeners.push(l),
    announce: (t) => listeners.forEach((l) => l(t)),
    close: async () => undefined,
  };
}

/** A read that counts its calls and answers `value()` at the time. */
function counted<V>(value: () => V): { read: () => Promise<V>; calls: () => number } {
  let n = 0;
  return { read: async () => (n++, value()), calls: () => n };
}

test('while the feed is live a key is read once; its topic or a lost feed (*) empties the cache, other topics do not', async () => {
  const feed = fakeFeed();
  const cache = new ReadCache<string>(feed, 'api_keys', { ttlMs: 60_000, maxEntries: 10 });
  let now = 'v1';
  const r = counted(() => now);
  assert.equal(await cache.get('k', r.read), 'v1');
  now = 'v2';
  assert.equal(await cache.get('k', r.read), 'v1', 'served from memory');
  assert.equal(r.calls(), 1);
  feed.announce('projects');
  assert.equal(await cache.get('k', r.read), 'v1', "another topic's change keeps it");
  feed.announce('api_keys');
  assert.equal(await cache.get('k', r.read), 'v2', 'its topic empties it');
  now = 'v3';
  feed.announce('*');
  assert.equal(await cache.get('k', r.read), 'v3', 'a lost or regained feed empties it');
  assert.equal(r.calls(), 3);
});

test('without a live feed (or none) every get reads', async () => {
  const feed = fakeFeed();
  feed.live = false;
  for (const cache of [
    new ReadCache<number>(feed, 't', { ttlMs: 60_000, maxEntries: 10 }),
    new ReadCache<number>(undefined, 't', { ttlMs: 60_000, maxEntries: 10 }),
  ]) {
    const r = counted(() => 1);
    await cache.get('k', r.read);
    await cache.get('k', r.read);
    assert.equal(r.calls(), 2);
  }
});

test('a read in flight while the cache is emptied is answered but not kept: it may predate the change', async () => {
  const feed = fakeFeed();
  const cache = new ReadCache<string>(feed, 't', { ttlMs: 60_000, maxEntries: 10 });
  let release!: () => void;
  const slow = cache.get('k', () => new Promise<string>((res) => (release = () => res('before the change'))));
  feed.announce('t');
  release();
  assert.equal(await slow, 'before the change');
  assert.equal(await cache.get('k', async () => 'after'), 'after', 'the old answer was not kept');
});

test('keep filters what is kept; entries expire after ttlMs; the cache starts over past maxEntries', async () => {
  const feed = fakeFeed();
  const misses = new ReadCache<string | undefined>(feed, 't', { ttlMs: 60_000, maxEntries: 2, keep: (v) => v !== undefined });
  const none = counted(() => undefined);
  await misses.get('nobody', none.read);
  await misses.get('nobody', none.read);
  assert.equal(none.calls(), 2, 'a miss is not kept');
  const r = counted(() => 'x');
  await misses.get('a', r.read);
  await misses.get('b', r.read);
  await misses.get('c', r.read); // past 2: the cache starts over, then keeps c
  await misses.get('c', r.read);
  await misses.get('a', r.read);
  assert.equal(r.calls(), 4);
  const brief = new ReadCache<string>(feed, 't', { ttlMs: 1, maxEntries: 10 });
  const b = counted(() => 'y');
  await brief.get('k', b.read);
  await new Promise((res) => setTimeout(res, 5));
  await brief.get('k', b.read);
  assert.equal(b.calls(), 2, 'an entry past its ttl is read again');
});

test('a value kept is answered at once, not as a promise; a read is a promise; without a live feed every get reads', async () => {
  const feed = fakeFeed();
  const cache = new ReadCache<string | undefined>(feed, 'projects', { ttlMs: 60_000, maxEntries: 10 });
  const r = counted<string | undefined>(() => 'p');
  const first = cache.get('k', r.read);
  assert.ok(first instanceof Promise, 'a miss reads');
  assert.equal(await first, 'p');
  assert.equal(cache.get('k', r.read), 'p', 'a hit is the value itself');
  const none = counted<string | undefined>(() => undefined);
  await cache.get('absent', none.read);
  assert.equal(cache.get('absent', none.read), undefined, 'an absent record kept is answered at once too');
  assert.equal(none.calls(), 1);
  feed.live = false;
  assert.ok(cache.get('k', r.read) instanceof Promise, 'not live: read');
  assert.equal(r.calls(), 2);
});
