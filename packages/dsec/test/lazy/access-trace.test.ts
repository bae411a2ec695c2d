/**
 * A layer's access trace (its prefetch list): the chunks the first node's sandboxes read, kept
 * with the layer in the blob store and prefetched by the next cold node as it mounts the layer.
 * A trace only ever decides what is fetched early, never what a read returns: a corrupt or wrong
 * trace is ignored or costs bytes, and every chunk, prefetched or not, is checked against its digest.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants, existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { open, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { BlobServer } from '../../src/edge/node/lazy/blob-server.js';
import { LazyLayers } from '../../src/edge/node/lazy/lazy-layers.js';
import { readMounts } from '../../src/host/mounts.js';
import { LayerStore, type LayerDigest } from '../../src/image/layer-store.js';
import { fuseSkipReason } from './fuse-skip.js';

const CHUNK = 64 * 1024;
const TOKEN = 'trace-token';

describe('access traces of lazy layers', { skip: fuseSkipReason(), timeout: 120_000 }, () => {
  let root = '';
  let store: LayerStore;
  let server: BlobServer;
  let nodes = 0;
  const started: LazyLayers[] = [];

  /** A cold node: its own daemon, chunk cache and node directory. */
  function coldNode(): LazyLayers {
    const node = new LazyLayers({
      nodeDir: join(root, `node-${nodes++}`),
      source: () => ({ url: server.url, token: TOKEN }),
      budgetBytes: 1 << 30,
      otherChargedBytes: () => 0,
      inUse: () => false,
      onDaemonDeath: () => undefined,
      retries: 3,
      attemptTimeoutMs: 2_000,
      connectTimeoutMs: 500,
    });
    started.push(node);
    return node;
  }
  async function addBlob(chunks: number): Promise<{ digest: LayerDigest; data: Buffer }> {
    const data = randomBytes(chunks * CHUNK);
    const tmp = store.tempPath();
    writeFileSync(tmp, data);
    return { digest: await store.add(tmp), data };
  }
  const tracePath = (d: LayerDigest) => store.chunkIndexPath(d).replace('.chunks.json', '.prefetch.json');
  const cachedChunks = (node: LazyLayers, d: LayerDigest, of: number) =>
    Array.from({ length: of }, (_, i) => i).filter((i) => existsSync(join(node.daemon.cacheDir, d.slice(7), `c${i}`)));
  /** Waits (bounded) until the node's cache holds the chunks; the cache's chunks then. */
  async function untilCached(node: LazyLayers, d: LayerDigest, want: number[], of: number): Promise<number[]> {
    for (let i = 0; i < 1000 && !want.every((c) => cachedChunks(node, d, of).includes(c)); i++) await new Promise((r) => setTimeout(r, 10));
    return cachedChunks(node, d, of);
  }
  /** Reads `len` bytes at `off` of the layer file; O_DIRECT, so the kernel's readahead brings no neighbour chunk. */
  async function readAt(path: string, off: number, len: number): Promise<Buffer> {
    const fh = await open(path, constants.O_RDONLY | constants.O_DIRECT);
    try {
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, off);
      return buf;
    } finally {
      await fh.close();
    }
  }

  before(async () => {
    root = mkdtempSync('/var/tmp/dsec-test-trace-');
    store = new LayerStore(join(root, 'store'), { chunkSize: CHUNK });
    server = new BlobServer({ store, token: TOKEN });
    await server.listen();
  });
  after(async () => {
    for (const n of started) await n.stop();
    await server?.close();
    assert.deepEqual(
      readMounts().filter((m) => m.mountPoint.startsWith(root)),
      [],
      'no mount left',
    );
    rmSync(root, { recursive: true, force: true });
  });

  test('recorded from the first node, kept with the layer, and fetched by a cold node before anything reads it', async () => {
    const { digest, data } = await addBlob(8);
    const first = coldNode();
    const path = await first.ensure(digest);
    await readAt(path, 5 * CHUNK, 4096);
    await readAt(path, 2 * CHUNK, 4096);
    first.unmounted(digest);
    await first.stop(); // waits for the trace to reach the store
    assert.deepEqual((JSON.parse(readFileSync(tracePath(digest), 'utf8')) as { chunks: number[] }).chunks, [0, 5, 2]);

    const second = coldNode();
    const p2 = await second.ensure(digest); // loads the index, so the daemon starts prefetching
    assert.deepEqual(await untilCached(second, digest, [0, 5, 2], 8), [0, 2, 5], 'the traced chunks, and only they, arrive unasked');
    assert.deepEqual(await readFile(p2), data, 'and the layer reads whole and right');
  });

  test('a corrupt trace in the store is ignored: the node fetches only what is read', async () => {
    const { digest, data } = await addBlob(6);
    writeFileSync(tracePath(digest), '{"chunks": [1, 2, oops');
    const node = coldNode();
    const path = await node.ensure(digest);
    assert.equal(existsSync(join(node.daemon.cacheDir, digest.slice(7), 'prefetch')), false, 'no prefetch list handed to the daemon');
    assert.deepEqual(await readAt(path, 3 * CHUNK, 4096), data.subarray(3 * CHUNK, 3 * CHUNK + 4096));
    assert.deepEqual(cachedChunks(node, digest, 6), [0, 3]);
  });

  test('entries of a trace that name no chunk of the layer are dropped; the rest is prefetched', async () => {
    const { digest, data } = await addBlob(6);
    writeFileSync(tracePath(digest), JSON.stringify({ chunks: [4, -1, 99, 'x', 1.5, 6] }));
    const node = coldNode();
    const path = await node.ensure(digest);
    assert.equal(readFileSync(join(node.daemon.cacheDir, digest.slice(7), 'prefetch'), 'utf8'), '4\n');
    assert.deepEqual(await untilCached(node, digest, [0, 4], 6), [0, 4]);
    assert.deepEqual(await readFile(path), data);
  });

  test('a garbled prefetch list on the node is ignored by the daemon; reads stay right', async () => {
    const { digest, data } = await addBlob(4);
    const node = coldNode();
    const dir = join(node.daemon.cacheDir, digest.slice(7));
    // What a torn write or a stray editor would leave: the daemon stops at the first non-number.
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'prefetch'), 'zz\n2\n');
    const path = await node.ensure(digest);
    assert.deepEqual(await readAt(path, CHUNK, 4096), data.subarray(CHUNK, CHUNK + 4096));
    assert.deepEqual(cachedChunks(node, digest, 4), [0, 1]);
  });

  test('a sandbox is charged for the chunks it read first, the same whether the prefetcher or it fetched them', async () => {
    const { digest } = await addBlob(6);
    writeFileSync(tracePath(digest), JSON.stringify({ chunks: [1, 2] }));
    const node = coldNode();
    const path = await node.ensure(digest);
    await untilCached(node, digest, [1, 2], 6); // the prefetcher got 1 and 2 before anyone read them
    // A reader in a sandbox's cgroup (the daemon finds the sandbox from the FUSE request's pid).
    const id = `sb-tracetest${randomBytes(4).toString('hex')}`;
    const cg = join('/sys/fs/cgroup/pids/dsec', id);
    mkdirSync(cg, { recursive: true });
    try {
      await new Promise<void>((res, rej) => {
        const script = `echo $$ > ${cg}/cgroup.procs && exec dd if=${path} bs=4096 skip=${CHUNK / 4096} count=${(3 * CHUNK) / 4096} iflag=direct status=none of=/dev/null`;
        const sh = spawn('sh', ['-c', script], { stdio: ['ignore', 'ignore', 'pipe'] });
        let err = '';
        sh.stderr.on('data', (b: Buffer) => (err += String(b)));
        sh.on('close', (code) => (code === 0 ? res() : rej(new Error(`reader: ${err.trim()}`))));
      });
      const mine = node.stats().sandboxes.find((x) => x.id === id);
      assert.deepEqual(
        mine,
        { id, readBytes: 3 * CHUNK, readChunks: 3, fetchedBytes: 3 * CHUNK, fetchedChunks: 3 },
        'chunks 1 and 2 (prefetched) and 3 (fetched on demand)',
      );
      const layer = node.stats().layers.find((l) => l.digest === digest)!;
      assert.equal(layer.prefetchedBytes, 2 * CHUNK);
      assert.equal(layer.readBytes, 4 * CHUNK, "chunk 0 (the superblock, read by ensure) and the reader's three");
      assert.equal(layer.fetchedBytes, 4 * CHUNK);
    } finally {
      rmdirSync(cg);
    }
  });

  test('a prefetched chunk is checked like any other: a corrupt one is refused and fetched again', async () => {
    const { digest, data } = await addBlob(4);
    writeFileSync(tracePath(digest), JSON.stringify({ chunks: [2, 3] }));
    const node = coldNode();
    server.corruptNext = 1; // the next range response (chunk 0, or a prefetched one) has a flipped byte
    const path = await node.ensure(digest);
    await untilCached(node, digest, [0, 2, 3], 4);
    assert.equal(server.corruptNext, 0, 'the server did send a corrupt chunk');
    const s = node.stats().layers.find((l) => l.digest === digest)!;
    assert.equal(s.digestMismatches, 1, 'refused');
    assert.deepEqual(await readFile(path), data, 'never served');
  });
});
