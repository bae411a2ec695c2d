/**
 * The node layer cache under a real server: the cache directory sits on a tmpfs of its own, so the
 * layer store is on another filesystem (as a network mount would be) and every layer is a verified
 * copy; the budget is 0, so a layer leaves the cache as soon as no sandbox mounts it. Sandboxes
 * still run from evicted layers (fetched again), a corrupt store blob is refused, and a restart
 * keeps the mounted layer's cache entry.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError, Sandbox } from '@dsec/sdk';
import type { LayerCacheStats } from '../src/edge/node/layer-cache.js';
import { fixDataDirFs } from '../src/host/data-dir-fs.js';
import { findLeaks } from '../src/host/leak-check.js';
import { readMounts } from '../src/host/mounts.js';
import { mount, umount } from '../src/host/syscalls.js';
import type { LayerDigest } from '../src/image/layer-store.js';
import type { RunningDsec } from '../src/runtime/all-in-one.js';
import { buildTestImage } from './helpers/images.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from './helpers/server.js';
import { call } from './helpers/wire.js';

describe('node layer cache: a store on another filesystem, budget 0', { skip: integrationSkipReason(), timeout: 180_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let cacheMount = '';
  let dsec: RunningDsec | undefined;
  let layer: LayerDigest;
  const conn = () => ({ url: dsec!.url, apiKey: dsec!.apiKey });
  const stats = (): LayerCacheStats => dsec!.edge.layerCache.stats();

  before(async () => {
    dataDir = makeDataDir();
    // On an overlay root doctor puts a tmpfs on the data dir at start, which would hide a cache
    // mount made before it (the cache would then share the store's filesystem): apply it first.
    const fs = fixDataDirFs(dataDir);
    assert.ok(fs.ok, fs.detail);
    cacheMount = join(dataDir, 'node', 'layer-cache');
    mkdirSync(cacheMount, { recursive: true });
    mount('tmpfs', cacheMount, 'tmpfs', 0, 'size=256m,mode=0700');
    dsec = await startDsec(dataDir, { edgeId, layerCacheMiB: 0 });
    layer = dsec.images.get(dsec.images.resolve('busybox')!)!.layers[0]!;
    assert.notEqual(statSync(cacheMount).dev, statSync(dsec.images.layers.dir).dev, 'the cache must be on its own filesystem');
  });
  after(async () => {
    await dsec?.close({ killAll: true });
    if (cacheMount && readMounts().some((m) => m.mountPoint === cacheMount)) umount(cacheMount);
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('a sandbox runs from a verified copy of its layer in the cache', async () => {
    const sb = await Sandbox.create({ ...conn(), labels: { case: 'first' } });
    const r = await sb.commands.run('busybox echo ok');
    assert.equal(r.stdout, 'ok\n', r.stderr);
    const cached = dsec!.edge.layerCache.path(layer);
    assert.deepEqual(readFileSync(cached), readFileSync(dsec!.images.layers.path(layer)));
    assert.equal(statSync(cached).nlink, 1, 'a copy, not a link');
    const s = stats();
    assert.deepEqual([s.entries, s.mounted, s.evictions], [1, 1, 0]);
    assert.equal(s.chargedBytes, dsec!.images.layers.size(layer));
    assert.equal(s.overBudget, true, 'a mounted layer stays even over budget, and the stats say so');
    await sb.kill();
  });

  test('the last kill unmounts the layer and evicts it; GET /v1/nodes shows the eviction', async () => {
    assert.equal(existsSync(dsec!.edge.layerCache.path(layer)), false);
    const res = await call(conn(), 'GET', '/v1/nodes');
    const node = (res.json as { nodes: { id: string; layerCache: LayerCacheStats }[] }).nodes[0]!;
    assert.equal(node.id, edgeId);
    assert.deepEqual(
      {
        entries: node.layerCache.entries,
        mounted: node.layerCache.mounted,
        evictions: node.layerCache.evictions,
        overBudget: node.layerCache.overBudget,
      },
      { entries: 0, mounted: 0, evictions: 1, overBudget: false },
    );
    assert.equal(node.layerCache.budgetBytes, 0);
  });

  test('a sandbox from an evicted layer works: the layer is fetched again', async () => {
    const sb = await Sandbox.create({ ...conn(), labels: { case: 'again' } });
    try {
      const r = await sb.commands.run('busybox echo again');
      assert.equal(r.stdout, 'again\n', r.stderr);
      assert.equal(stats().entries, 1);
    } finally {
      await sb.kill();
    }
    assert.equal(stats().evictions, 2);
  });

  test('a corrupt blob in the store is refused with a clear error; nothing is left behind', async () => {
    await buildTestImage(dsec!.images, 'corrupt-layer', (root) => writeFileSync(`${root}/hello`, 'hello\n'));
    const bad = dsec!.images.get(dsec!.images.resolve('corrupt-layer')!)!.layers[0]!;
    const blob = dsec!.images.layers.path(bad);
    const bytes = readFileSync(blob);
    bytes[bytes.length >> 1] = bytes[bytes.length >> 1]! ^ 0xff;
    writeFileSync(blob, bytes);
    let err: unknown;
    try {
      await Sandbox.create({ ...conn(), image: 'corrupt-layer', labels: { case: 'corrupt' } });
    } catch (e) {
      err = e;
    }
    assert.ok(err instanceof DsecError, `create should fail: ${String(err)}`);
    assert.match(err.message, new RegExp(`layer ${bad}: the blob from .* hashes to sha256:[0-9a-f]{64}; it is corrupt or truncated`));
    assert.equal(dsec!.edge.layerCache.has(bad), false);
    assert.equal(dsec!.edge.layerMounts.refCount(bad), 0);
    assert.equal(existsSync(dsec!.edge.layerMounts.mountPoint(bad)), false);
    assert.deepEqual(readdirSync(join(cacheMount, '.tmp')), [], 'the rejected copy is removed');
    const failed = await Sandbox.list({ ...conn(), labels: { case: 'corrupt' } });
    assert.equal(failed[0]?.status, 'failed');
    assert.deepEqual(await findLeaks(dataDir, { onlyIds: failed.map((s) => s.id) }), []);
  });

  test('a restart keeps the mounted layer in the cache and the sandbox on it', async () => {
    const sb = await Sandbox.create({ ...conn(), labels: { case: 'restart' } });
    await dsec!.close(); // the sandbox keeps running
    dsec = await startDsec(dataDir, { edgeId, layerCacheMiB: 0 });
    assert.equal(dsec.edge.layerCache.has(layer), true, 'the mounted layer survives reconcile');
    assert.equal(stats().mounted, 1);
    const again = await Sandbox.connect(sb.id, conn());
    const r = await again.commands.run('busybox echo still here');
    assert.equal(r.stdout, 'still here\n', r.stderr);
    await again.kill();
    assert.equal(dsec.edge.layerCache.has(layer), false, 'evicted once unmounted');
  });
});
