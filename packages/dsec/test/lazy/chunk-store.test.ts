/**
 * The lazy chunk store for real: dsec-chunk-fuse on /dev/fuse, fetching from a local HTTP blob
 * server over range requests. Chunks are verified (a corrupt one is refused and fetched again),
 * concurrent first reads of one chunk share one fetch, a store outage gives EIO (never a hang)
 * and heals, eviction deletes unmounted layers' chunks, a killed daemon's connection is aborted
 * (readers get an error at once), and stopping leaves no mount or process.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { BlobServer } from '../../src/edge/node/lazy/blob-server.js';
import { LazyLayers } from '../../src/edge/node/lazy/lazy-layers.js';
import { fuseConnectionOf } from '../../src/edge/node/lazy/fuse-connection.js';
import { readMounts } from '../../src/host/mounts.js';
import { LayerStore, type LayerDigest } from '../../src/image/layer-store.js';
import { fuseSkipReason } from './fuse-skip.js';

const CHUNK = 64 * 1024;

/** `len` bytes at `off` (both multiples of 4096) read by dd with O_DIRECT in a process of its own. */
function readDirect(path: string, off: number, len: number): Promise<Buffer> {
  return new Promise((res, rej) => {
    const dd = spawn('dd', [
      `if=${path}`,
      'bs=4096',
      `skip=${off / 4096}`,
      `count=${Math.ceil(len / 4096)}`,
      'status=none',
      'iflag=direct',
    ]);
    const out: Buffer[] = [];
    let err = '';
    dd.stdout.on('data', (b: Buffer) => out.push(b));
    dd.stderr.on('data', (b: Buffer) => (err += String(b)));
    dd.on('close', (code) => (code === 0 ? res(Buffer.concat(out).subarray(0, len)) : rej(new Error(`dd: ${err.trim()}`))));
  });
}

/** The whole file through the page cache, read by cat in a process of its own; rejects with cat's error. */
function catFile(path: string): Promise<Buffer> {
  return new Promise((res, rej) => {
    const cat = spawn('cat', [path]);
    const out: Buffer[] = [];
    let err = '';
    cat.stdout.on('data', (b: Buffer) => out.push(b));
    cat.stderr.on('data', (b: Buffer) => (err += String(b)));
    cat.on('close', (code) => (code === 0 ? res(Buffer.concat(out)) : rej(new Error(`cat: ${err.trim()}`))));
  });
}

describe('lazy chunk store (dsec-chunk-fuse over HTTP ranges)', { skip: fuseSkipReason(), timeout: 120_000 }, () => {
  let root = '';
  let store: LayerStore;
  let server: BlobServer;
  let lazy: LazyLayers;
  const mounted = new Set<LayerDigest>();
  const deaths: string[] = [];
  let budget = 1 << 30;

  /** A fresh blob of random bytes in the store (its chunk index recorded by add()). */
  async function addBlob(bytes: number): Promise<{ digest: LayerDigest; data: Buffer }> {
    const data = randomBytes(bytes);
    const tmp = store.tempPath();
    writeFileSync(tmp, data);
    return { digest: await store.add(tmp), data };
  }
  const stat = (d: LayerDigest) => lazy.stats().layers.find((l) => l.digest === d)!;

  before(async () => {
    root = mkdtempSync('/var/tmp/dsec-test-lazy-');
    store = new LayerStore(join(root, 'store'), { chunkSize: CHUNK });
    server = new BlobServer({ store, token: 'secret-token' });
    await server.listen();
    lazy = new LazyLayers({
      nodeDir: join(root, 'node'),
      source: () => ({ url: server.url, token: 'secret-token' }),
      get budgetBytes() {
        return budget;
      },
      otherChargedBytes: () => 0,
      inUse: (d) => mounted.has(d),
      onDaemonDeath: (reason) => deaths.push(reason),
      retries: 2,
      attemptTimeoutMs: 1_000,
      connectTimeoutMs: 500,
    });
  });
  after(async () => {
    await lazy?.stop();
    await server?.close();
    const left = readMounts().filter((m) => m.mountPoint.startsWith(root));
    assert.deepEqual(left, [], 'no mount left');
    rmSync(root, { recursive: true, force: true });
  });

  test('reads return the blob, fetched chunk by chunk and verified; the token reaches the store', async () => {
    const { digest, data } = await addBlob(5 * CHUNK + 1234);
    const path = await lazy.ensure(digest);
    assert.ok(fuseConnectionOf(lazy.daemon.mountPoint) !== undefined, 'the daemon mounted its FUSE file system');
    assert.equal(stat(digest).fetchedChunks, 1, 'ensure() brings in the first chunk (the superblock, for mount)');
    // One chunk read: only that chunk is fetched.
    // O_DIRECT: the kernel's readahead would pull in the next chunks too.
    assert.deepEqual(await readDirect(path, 2 * CHUNK, 4096), data.subarray(2 * CHUNK, 2 * CHUNK + 4096));
    assert.equal(stat(digest).fetchedChunks, 2, 'one read, one more chunk');
    assert.deepEqual(await readFile(path), data);
    const s = stat(digest);
    assert.deepEqual([s.fetchedBytes, s.fetchedChunks, s.cachedBytes, s.digestMismatches], [data.length, 6, data.length, 0]);
    assert.equal(lazy.stats().daemon, 'running');
  });

  test('a chunk whose bytes do not match its digest is refused and fetched again', async () => {
    const { digest, data } = await addBlob(2 * CHUNK);
    const path = await lazy.ensure(digest);
    server.corruptNext = 1;
    assert.deepEqual(await readFile(path), data);
    assert.equal(server.corruptNext, 0, 'the server did send a corrupt chunk');
    const s = stat(digest);
    assert.equal(s.digestMismatches, 1);
    assert.equal(s.fetchedChunks, 2);
  });

  test('a chunk corrupt on every attempt is never served: the reader gets EIO', async () => {
    const { digest } = await addBlob(2 * CHUNK);
    const path = await lazy.ensure(digest);
    server.corruptNext = 1000; // every attempt (the kernel retries a failed readahead itself)
    try {
      await assert.rejects(readDirect(path, CHUNK, CHUNK), /Input\/output error/);
    } finally {
      server.corruptNext = 0;
    }
    assert.ok(stat(digest).digestMismatches >= 2, 'each of the bounded attempts was refused');
    assert.equal(stat(digest).cachedBytes, CHUNK, 'nothing unverified is cached (chunk 0 came with ensure)');
  });

  test('concurrent first reads of one chunk share one fetch', async () => {
    const { digest, data } = await addBlob(4 * CHUNK);
    const path = await lazy.ensure(digest);
    const before = server.rangeRequests;
    // Separate processes, so the reads reach the daemon at once (not serialised by one caller).
    // Separate processes reading with O_DIRECT, so the reads reach the daemon at once rather
    // than one page-locked readahead.
    const readers = Array.from({ length: 8 }, (_, i) => readDirect(path, CHUNK + i * 4096, 4096));
    const got = await Promise.all(readers);
    got.forEach((b, i) => assert.deepEqual(b, data.subarray(CHUNK + i * 4096, CHUNK + (i + 1) * 4096)));
    assert.equal(server.rangeRequests - before, 1, 'one range request for the chunk');
    assert.equal(stat(digest).fetchedChunks, 2, 'chunk 0 at ensure(), chunk 1 once');
  });

  test('a store outage gives the reader EIO after bounded retries, and reads work once it is back', async () => {
    const { digest, data } = await addBlob(3 * CHUNK);
    const path = await lazy.ensure(digest);
    server.down = true;
    server.dropConnections();
    try {
      // cat, not fs.readFile: node's readFile returns what it got before an EIO as the whole file.
      await assert.rejects(catFile(path), /Input\/output error/);
      server.down = false;
      server.hang = true; // the store accepts and never answers: each attempt is capped
      await assert.rejects(catFile(path), /Input\/output error/);
    } finally {
      server.down = false;
      server.hang = false;
      server.dropConnections();
    }
    assert.ok(stat(digest).failedFetches >= 2);
    assert.deepEqual(await catFile(path), data, 'no failure is remembered: the next read fetches');
  });

  test('over budget, the chunks of layers nothing mounts are evicted and fetched again on the next read', async () => {
    const { digest, data } = await addBlob(3 * CHUNK);
    const path = await lazy.ensure(digest);
    mounted.add(digest);
    assert.deepEqual(await readFile(path), data);
    budget = 0;
    try {
      lazy.unmounted(mounted.has(digest) ? (mounted.delete(digest), digest) : digest);
      assert.equal(stat(digest).cachedBytes, 0);
      assert.equal(lazy.stats().chunkBytes, 0, 'every unmounted layer was evicted');
      assert.ok(lazy.stats().evictedChunks >= 3);
      const fetched = stat(digest).fetchedChunks;
      // O_DIRECT: past the page cache, which still holds the pages read before.
      assert.deepEqual(await readDirect(await lazy.ensure(digest), 0, data.length), data);
      assert.equal(stat(digest).fetchedChunks, fetched + 3, 'fetched again (chunk 0 by ensure)');
    } finally {
      budget = 1 << 30;
    }
  });

  test('the chunks a first run read become the prefetch list; a fresh node prefetches them', async () => {
    const { digest, data } = await addBlob(6 * CHUNK);
    const path = await lazy.ensure(digest);
    for (const i of [4, 1]) await readDirect(path, i * CHUNK, 4096);
    lazy.unmounted(digest); // publishes the touched list
    const prefetchFile = store.chunkIndexPath(digest).replace('.chunks.json', '.prefetch.json');
    for (let i = 0; i < 200 && !existsSync(prefetchFile); i++) await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual((JSON.parse(readFileSync(prefetchFile, 'utf8')) as { chunks: number[] }).chunks, [0, 4, 1], 'in first-read order');

    // A second node (its own daemon and cache) mounting the layer fetches chunks 4 and 1 unasked.
    const other = new LazyLayers({
      nodeDir: join(root, 'node2'),
      source: () => ({ url: server.url, token: 'secret-token' }),
      budgetBytes: 1 << 30,
      otherChargedBytes: () => 0,
      inUse: () => false,
      onDaemonDeath: () => undefined,
    });
    try {
      const p2 = await other.ensure(digest);
      statSync(p2); // the daemon loads the layer's index, and starts prefetching, at its first lookup
      const chunkDir = join(root, 'node2', 'lazy', 'chunks', digest.slice(7));
      const has = (c: string) => existsSync(join(chunkDir, c));
      for (let i = 0; i < 500 && !(has('c4') && has('c1')); i++) await new Promise((r) => setTimeout(r, 10));
      assert.deepEqual(
        ['c0', 'c1', 'c2', 'c3', 'c4', 'c5'].filter(has),
        ['c0', 'c1', 'c4'],
        'the listed chunks (and c0, which ensure() reads), nothing else',
      );
      assert.deepEqual(await readFile(p2), data);
    } finally {
      await other.stop();
    }
  });

  test('a killed daemon: its connection is aborted, readers fail at once, the edge is told', async () => {
    const { digest } = await addBlob(2 * CHUNK);
    const path = await lazy.ensure(digest);
    const pid = lazy.daemon.pid!;
    process.kill(pid, 'SIGKILL');
    for (let i = 0; i < 500 && deaths.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(deaths.length, 1);
    assert.match(deaths[0]!, /dsec-chunk-fuse \(pid \d+\) killed by SIGKILL/);
    await assert.rejects(readFile(path), (err: NodeJS.ErrnoException) => ['ENOTCONN', 'ENOENT', 'EIO'].includes(err.code ?? ''));
    lazy.daemon.clearMount();
    assert.equal(fuseConnectionOf(lazy.daemon.mountPoint), undefined, 'the dead mount is gone');
    // The next layer use starts a new daemon, and the chunk cache survived.
    const again = await lazy.ensure(digest);
    assert.notEqual(lazy.daemon.pid, pid);
    assert.equal((await readFile(again)).length, 2 * CHUNK);
  });
});
