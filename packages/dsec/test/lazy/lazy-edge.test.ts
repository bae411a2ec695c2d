/**
 * `--layer-fetch lazy` end to end, for real: a dsec server whose edge mounts layers from
 * dsec-chunk-fuse, which fetches 64 KiB chunks from the server's own blob endpoint
 * (`/v1/blobs/{digest}` ranges, `/chunks` index) under the cluster token. A sandbox runs a command
 * from a layer the node never copied; GET /v1/nodes reports the bytes fetched; a restarted edge
 * adopts the daemon with the sandbox still working; a killed daemon fails its sandboxes with a
 * reason and leaves no mount; and the node works again after.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { LayerCacheStats } from '@dsec/sdk/schema';
import { compileOptions } from '../../src/config/options.js';
import { fuseConnectionOf } from '../../src/edge/node/lazy/fuse-connection.js';
import { CHUNK_FUSE_BINARY } from '../../src/host/native-helpers.js';
import { readMounts } from '../../src/host/mounts.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startAllInOne, type RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId } from '../helpers/server.js';
import { parsePromText } from '../helpers/prom-text.js';
import { call } from '../helpers/wire.js';

function skipReason(): string | undefined {
  return (
    integrationSkipReason() ??
    (existsSync('/dev/fuse') ? undefined : 'no /dev/fuse') ??
    (existsSync(CHUNK_FUSE_BINARY) ? undefined : `${CHUNK_FUSE_BINARY} not built`)
  );
}

describe('lazy layers in a real server (--layer-fetch lazy)', { skip: skipReason(), timeout: 180_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let dsec: RunningDsec | undefined;
  const conn = () => ({ url: dsec!.url, apiKey: dsec!.apiKey });
  const start = async (): Promise<RunningDsec> =>
    startAllInOne(
      compileOptions({ dataDir, listen: '127.0.0.1:0', edgeId, layerFetch: 'lazy', layerChunkKiB: '64', logLevel: 'silent' }, {}),
    );
  const lazyMount = () => join(dataDir, 'node', 'lazy', 'mnt');
  const layerMounts = () => readMounts().filter((m) => m.mountPoint.startsWith(join(dataDir, 'node', 'layers') + '/'));

  before(async () => {
    dataDir = makeDataDir();
    dsec = await start();
    await buildBusyboxImage(dsec.images);
  });
  after(async () => {
    await dsec?.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('a sandbox runs from a layer mounted through FUSE, and /v1/nodes counts the bytes fetched', async () => {
    const sb = await Sandbox.create({ ...conn(), labels: { case: 'lazy' } });
    const r = await sb.commands.run('busybox echo lazy-ok && busybox ls /bin | busybox head -n 1');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /^lazy-ok\n/);
    assert.ok(
      layerMounts().length > 0 && layerMounts().every((m) => m.source.startsWith(lazyMount() + '/')),
      'layers are mounted from files on the lazy mount',
    );
    assert.equal(
      existsSync(join(dataDir, 'node', 'layer-cache')) && dsec!.edge.layerCache.stats().entries,
      0,
      'nothing was copied into the eager cache',
    );
    const res = await call(conn(), 'GET', '/v1/nodes');
    const cache = (res.json as { nodes: { layerCache: LayerCacheStats }[] }).nodes[0]!.layerCache;
    const lazy = cache.lazy!;
    assert.equal(lazy.daemon, 'running');
    const layer = lazy.layers[0]!;
    assert.ok(layer.fetchedBytes > 0 && layer.fetchedBytes <= layer.sizeBytes, JSON.stringify(layer));
    assert.equal(layer.digestMismatches, 0);
    assert.equal(layer.mounted, true);
    assert.ok(cache.chargedBytes >= lazy.chunkBytes && lazy.chunkBytes > 0, 'chunk bytes count against the layer cache budget');
    assert.ok(layer.readBytes! > 0 && layer.readBytes! <= layer.fetchedBytes, 'no trace yet: what was read is what was fetched, at most');
    const mine = lazy.sandboxes.find((x) => x.id === sb.id);
    assert.ok(
      mine && mine.readBytes! > 0 && mine.readBytes! <= layer.readBytes! && mine.fetchedBytes === mine.readBytes,
      `the sandbox's own first reads are charged to it: ${JSON.stringify(lazy.sandboxes)}`,
    );
    // /metrics exports the same counts (read from the edge at the scrape): lazy bytes fetched, at least those above.
    const metrics = parsePromText((await call(conn(), 'GET', '/metrics', { key: null })).text);
    const edge = { edge: edgeId, pool: 'default' };
    assert.ok((metrics.get('dsec_lazy_fetched_bytes_total', edge) ?? 0) >= lazy.fetchedBytes && lazy.fetchedBytes >= layer.fetchedBytes);
    assert.ok((metrics.get('dsec_lazy_chunk_cache_bytes', edge) ?? 0) > 0);
    assert.equal(metrics.get('dsec_lazy_failed_fetches_total', edge), 0);
    // Per image: the image's layers summed (busybox has one), the same counts as the layer's while the sandbox idles.
    const [image] = dsec!.images.list();
    const perImage = { ...edge, image: image!.id, name: image!.names[0]! };
    const now = (await call(conn(), 'GET', '/v1/nodes')).json as { nodes: { layerCache: LayerCacheStats }[] };
    const layerNow = now.nodes[0]!.layerCache.lazy!.layers.find((l) => l.digest === image!.layers[0])!;
    assert.equal(metrics.get('dsec_lazy_image_read_bytes_total', perImage), layerNow.readBytes);
    assert.equal(metrics.get('dsec_lazy_image_fetched_bytes_total', perImage), layerNow.fetchedBytes);
    assert.equal(metrics.get('dsec_lazy_image_read_ratio', perImage), layerNow.readBytes! / image!.sizeBytes);
    await sb.kill();
  });

  test('GET /v1/blobs/{digest}/chunks gives the recorded per-chunk digests; PUT .../prefetch keeps the first list', async () => {
    const token = readFileSync(join(dataDir, 'cluster-token'), 'utf8').trim();
    const digest = dsec!.images.get(dsec!.images.resolve('busybox')!)!.layers[0]!;
    const req = (method: string, path: string, body?: unknown) =>
      fetch(`${dsec!.url}${path}`, {
        method,
        headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
        ...(body ? { body: JSON.stringify(body) } : {}),
      });
    const res = await req('GET', `/v1/blobs/${digest}/chunks`);
    assert.equal(res.status, 200);
    const index = (await res.json()) as { chunkSize: number; size: number; digests: string[]; prefetch: number[] };
    const blob = readFileSync(dsec!.images.layers.path(digest));
    assert.equal(index.chunkSize, 64 * 1024);
    assert.equal(index.size, blob.length);
    assert.deepEqual(
      index.digests,
      Array.from(
        { length: Math.ceil(blob.length / index.chunkSize) },
        (_, i) =>
          `sha256:${createHash('sha256')
            .update(blob.subarray(i * index.chunkSize, (i + 1) * index.chunkSize))
            .digest('hex')}`,
      ),
    );
    // The first sandbox's kill (test above) recorded the chunks it read as the layer's prefetch list.
    assert.ok(index.prefetch.length > 0 && index.prefetch.length <= index.digests.length, JSON.stringify(index.prefetch));
    const again = await req('PUT', `/v1/blobs/${digest}/prefetch`, { chunks: [0] });
    assert.deepEqual(await again.json(), { recorded: false }, 'the first list is kept');
    const bad = await req('PUT', `/v1/blobs/${digest}/prefetch`, { chunks: [index.digests.length] });
    assert.equal(bad.status, 400);
    assert.equal(((await bad.json()) as { error: { code: string } }).error.code, 'INVALID_REQUEST');
    const missing = await req('GET', `/v1/blobs/sha256:${'0'.repeat(64)}/chunks`);
    assert.equal(missing.status, 404);
    const anon = await fetch(`${dsec!.url}/v1/blobs/${digest}/chunks`);
    assert.equal(anon.status, 401);
  });

  test('a restarted edge adopts the running daemon; a sandbox on it keeps reading', async () => {
    const sb = await Sandbox.create({ ...conn(), labels: { case: 'restart' } });
    const pid = dsec!.edge.lazyLayers!.daemon.pid;
    await dsec!.close(); // sandboxes and the daemon keep running
    dsec = await start();
    assert.equal(dsec.edge.lazyLayers!.daemon.pid, pid, 'the same daemon, adopted');
    const again = await Sandbox.connect(sb.id, conn());
    const r = await again.commands.run('busybox cat /etc/passwd >/dev/null && busybox echo still');
    assert.equal(r.stdout, 'still\n', r.stderr);
    await again.kill();
  });

  test('a killed daemon: its sandboxes are failed with a reason, their mounts go, and the node recovers', async () => {
    const a = await Sandbox.create({ ...conn(), labels: { case: 'victim' } });
    const pid = dsec!.edge.lazyLayers!.daemon.pid!;
    process.kill(pid, 'SIGKILL');
    let info = await call(conn(), 'GET', `/v1/sandboxes/${a.id}`);
    for (let i = 0; i < 500 && (info.json as { status: string }).status !== 'failed'; i++) {
      await new Promise((r) => setTimeout(r, 20));
      info = await call(conn(), 'GET', `/v1/sandboxes/${a.id}`);
    }
    const s = info.json as { status: string; reason?: string };
    assert.equal(s.status, 'failed');
    // Killed by SIGKILL (our child), or found dead (adopted by the restarted edge of the test before).
    assert.match(s.reason ?? '', /dsec-chunk-fuse \(pid \d+\) (killed by SIGKILL|found dead)/);
    assert.deepEqual(layerMounts(), [], 'the layer mounts on the dead daemon are gone');
    assert.equal(fuseConnectionOf(lazyMount()), undefined, 'so is its FUSE mount');
    const b = await Sandbox.create({ ...conn(), labels: { case: 'after' } });
    assert.equal((await b.commands.run('busybox echo back')).stdout, 'back\n');
    assert.notEqual(dsec!.edge.lazyLayers!.daemon.pid, pid, 'a new daemon');
    await b.kill();
  });
});
