/**
 * The node layer cache on real filesystems: a store beside the cache (hard links) and a store on a
 * tmpfs of its own (verified copies), LRU eviction under a budget, mounted layers kept, last use
 * surviving a restart, and layers GC removed from the store leaving the cache.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import { LayerStore, type LayerDigest } from '../../image/layer-store.js';
import { readMounts } from '../../host/mounts.js';
import { mount, umount } from '../../host/syscalls.js';
import { LocalBlobSource } from './blob-source.js';
import { LayerCache, LayerIntegrityError } from './layer-cache.js';

const skip = process.getuid?.() !== 0 ? 'the layer cache tests mount a tmpfs: run them as root' : undefined;
const BLOB = 64 * 1024;

/** A test directory under /var/tmp with a store on a tmpfs of its own and a store beside the node dir. */
function fixture() {
  const f = {
    dir: '',
    /** On the node dir's filesystem: the cache hard-links from it. */
    local: undefined as unknown as LayerStore,
    /** On its own tmpfs: the cache copies from it. */
    remote: undefined as unknown as LayerStore,
    remoteMount: '',
    nodeDirs: 0,
    setUp(): void {
      f.dir = mkdtempSync('/var/tmp/dsec-test-');
      f.local = new LayerStore(join(f.dir, 'local'));
      f.remoteMount = join(f.dir, 'remote');
      mkdirSync(f.remoteMount);
      mount('tmpfs', f.remoteMount, 'tmpfs', 0, 'size=16m');
      f.remote = new LayerStore(f.remoteMount);
    },
    tearDown(): void {
      if (!f.dir) return;
      if (readMounts().some((m) => m.mountPoint === f.remoteMount)) umount(f.remoteMount);
      assert.ok(!readMounts().some((m) => m.mountPoint.startsWith(f.dir)), `mounts left under ${f.dir}`);
      rmSync(f.dir, { recursive: true, force: true });
    },
    nodeDir(): string {
      return join(f.dir, `node${f.nodeDirs++}`);
    },
  };
  return f;
}

async function addBlob(store: LayerStore): Promise<LayerDigest> {
  const tmp = store.tempPath();
  writeFileSync(tmp, randomBytes(BLOB));
  return store.add(tmp);
}

/** A cache with a mutable set of mounted layers standing in for LayerMounts' refcounts. */
function cacheOn(nodeDir: string, store: LayerStore, budgetBytes: number, log?: pino.Logger) {
  const mounted = new Set<LayerDigest>();
  const cache = new LayerCache({
    nodeDir,
    source: new LocalBlobSource(store),
    budgetBytes,
    inUse: (d) => mounted.has(d),
    ...(log ? { log } : {}),
  });
  return { cache, mounted };
}

describe('LayerCache', { skip }, () => {
  const f = fixture();
  before(() => f.setUp());
  after(() => f.tearDown());

  test('a store on the same filesystem is hard-linked: same inode, no bytes charged', async () => {
    const digest = await addBlob(f.local);
    const { cache } = cacheOn(f.nodeDir(), f.local, 0);
    const p = await cache.ensure(digest);
    assert.equal(statSync(p).ino, statSync(f.local.path(digest)).ino);
    assert.equal(statSync(p).nlink, 2);
    const s = cache.stats();
    assert.equal(s.entries, 1);
    assert.equal(s.bytes, BLOB);
    assert.equal(s.chargedBytes, 0, 'a link costs nothing while the store keeps the blob');
    assert.equal(s.evictions, 0, 'a free entry is never evicted, even at budget 0');
  });

  test('a store on another filesystem is copied: a new inode with the same bytes, charged', async () => {
    const digest = await addBlob(f.remote);
    const { cache } = cacheOn(f.nodeDir(), f.remote, 1 << 30);
    const p = await cache.ensure(digest);
    assert.notEqual(statSync(p).dev, statSync(f.remote.path(digest)).dev);
    assert.equal(statSync(p).nlink, 1);
    assert.deepEqual(readFileSync(p), readFileSync(f.remote.path(digest)));
    assert.equal(cache.stats().chargedBytes, BLOB);
  });

  test('a corrupted store blob is refused with a clear error and leaves nothing in the cache', async () => {
    const digest = await addBlob(f.remote);
    const bytes = readFileSync(f.remote.path(digest));
    bytes[100] = bytes[100]! ^ 0xff;
    writeFileSync(f.remote.path(digest), bytes);
    const nodeDir = f.nodeDir();
    const { cache } = cacheOn(nodeDir, f.remote, 1 << 30);
    await assert.rejects(cache.ensure(digest), (err: unknown) => {
      assert.ok(err instanceof LayerIntegrityError, String(err));
      assert.match(err.message, new RegExp(`layer ${digest}: the blob from .* hashes to sha256:[0-9a-f]{64}; it is corrupt`));
      return true;
    });
    assert.equal(cache.has(digest), false);
    assert.equal(existsSync(cache.path(digest)), false);
    assert.deepEqual(readdirSync(join(nodeDir, 'layer-cache', '.tmp')), [], 'the partial copy is removed');
  });

  test('a cached file removed behind the cache is fetched again', async () => {
    const digest = await addBlob(f.remote);
    const { cache } = cacheOn(f.nodeDir(), f.remote, 1 << 30);
    rmSync(await cache.ensure(digest));
    const p = await cache.ensure(digest);
    assert.deepEqual(readFileSync(p), readFileSync(f.remote.path(digest)));
  });

  test('concurrent ensure() of one layer share one fetch', async () => {
    const digest = await addBlob(f.remote);
    const lines: string[] = [];
    const log = pino({ level: 'debug' }, new Writable({ write: (c: Buffer, _e, done) => (lines.push(c.toString()), done()) }));
    const { cache } = cacheOn(f.nodeDir(), f.remote, 1 << 30, log);
    const paths = await Promise.all(Array.from({ length: 8 }, () => cache.ensure(digest)));
    assert.equal(new Set(paths).size, 1);
    assert.equal(lines.filter((l) => l.includes('layer cached')).length, 1, lines.join(''));
  });

  test('over budget, the least recently used layer goes first', async () => {
    const [a, b, c] = [await addBlob(f.remote), await addBlob(f.remote), await addBlob(f.remote)];
    const { cache } = cacheOn(f.nodeDir(), f.remote, 2 * BLOB);
    await cache.ensure(a);
    await cache.ensure(b);
    await cache.ensure(a); // a is now more recent than b
    await cache.ensure(c);
    assert.deepEqual([cache.has(a), cache.has(b), cache.has(c)], [true, false, true]);
    assert.equal(existsSync(cache.path(b)), false);
    assert.equal(cache.stats().evictions, 1);
    assert.equal(cache.stats().chargedBytes, 2 * BLOB);
  });

  test('mounted layers are never evicted; the cache stays over budget and says so, until they are unmounted', async () => {
    const [a, b] = [await addBlob(f.remote), await addBlob(f.remote)];
    const { cache, mounted } = cacheOn(f.nodeDir(), f.remote, 0);
    mounted.add(a);
    await cache.ensure(a);
    mounted.add(b);
    await cache.ensure(b);
    const s = cache.stats();
    assert.deepEqual([s.entries, s.mounted, s.evictions, s.overBudget], [2, 2, 0, true]);
    mounted.delete(a);
    cache.unmounted(a);
    assert.equal(cache.has(a), false, 'the unmounted layer is evicted');
    assert.equal(cache.has(b), true, 'the mounted one stays');
    assert.deepEqual([cache.stats().evictions, cache.stats().overBudget], [1, true]);
  });

  test('last use survives a restart: the next edge evicts in the same order', async () => {
    const [a, b] = [await addBlob(f.remote), await addBlob(f.remote)];
    const nodeDir = f.nodeDir();
    const first = cacheOn(nodeDir, f.remote, 1 << 30).cache;
    await first.ensure(b);
    await first.ensure(a);
    await first.ensure(b); // b most recent
    const junk = join(first.dir, 'not-a-layer');
    writeFileSync(junk, 'x');
    writeFileSync(join(first.dir, '.tmp', 'half-copied.erofs'), 'x');
    const second = cacheOn(nodeDir, f.remote, BLOB).cache;
    second.reconcile();
    assert.deepEqual([second.has(a), second.has(b)], [false, true]);
    assert.equal(existsSync(junk), false, 'files that are not cache entries are removed');
    assert.deepEqual(readdirSync(join(second.dir, '.tmp')), []);
  });

  test('a layer GC removed from the store leaves the cache once unmounted, not before', async () => {
    const [a, b, c] = [await addBlob(f.local), await addBlob(f.local), await addBlob(f.local)];
    const { cache, mounted } = cacheOn(f.nodeDir(), f.local, 1 << 30);
    mounted.add(a);
    await cache.ensure(a);
    mounted.add(b);
    await cache.ensure(b);
    await cache.ensure(c); // cached, not mounted
    assert.equal(cache.stats().chargedBytes, 0, 'links to blobs the store holds are free');
    f.local.remove(a);
    f.local.remove(c);
    mounted.delete(b);
    cache.unmounted(b); // a layer's last unmount sweeps what GC removed from the store
    assert.deepEqual([cache.has(a), cache.has(b), cache.has(c)], [true, true, false]);
    assert.ok(existsSync(cache.path(a)), 'a mounted layer keeps its blob');
    assert.equal(cache.stats().chargedBytes, BLOB, 'the cache is now the only name of a, so a counts');
    mounted.delete(a);
    cache.unmounted(a);
    assert.equal(cache.has(a), false);
    assert.equal(existsSync(cache.path(a)), false);
    assert.equal(cache.stats().evictions, 0, 'dropping a layer the store lost is not an eviction');
  });
});
