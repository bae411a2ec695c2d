/**
 * The cluster's registry as the control plane's blob store: two replicas on one real PostgreSQL,
 * each with its own data dir (no shared layer dir), both configured with a real docker-registry
 * (CNCF distribution, deletes enabled). An image imported at replica A has its layers and its OCI
 * artifact in the registry before its record reaches the store; replica B, which has none of its
 * bytes, inspects it (sizes from the record), places a create on a real crun edge that reads the
 * layers from the registry (B still holds no copy), pushes it elsewhere and serves its blob (each
 * fetched into B's layer dir, its cache); a snapshot recorded at B starts at A. Deleting the image at A withdraws its artifact, and GC
 * at B deletes its blob in the registry. About 20 s. A registry whose deletes are off (distribution's
 * default) keeps the blobs: GC says so and keeps their records for a GC once deletes are on (2 s).
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { ImageInfo, ImportImageResult } from '@dsec/sdk/schema';
import { pino } from 'pino';
import { ClusterRegistry, imageTag } from '../../src/control/cluster/cluster-registry.js';
import { collectGarbage } from '../../src/control/image-gc.js';
import { StoreImageCatalog } from '../../src/control/image-catalog.js';
import { StateStore } from '../../src/control/state-store.js';
import { ImageStore, type ImageId } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { parseDsecManifest } from '../../src/image/registry/dsec-artifact.js';
import { RegistryClient } from '../../src/image/registry/registry-client.js';
import { parseRegistryRef } from '../../src/image/registry/registry-ref.js';
import type { RunningEdgeDaemon } from '../../src/runtime/edge-daemon.js';
import { postgresSkipReason } from '../helpers/postgres.js';
import { registrySkipReason, startTestRegistry, type TestRegistry } from '../helpers/registry.js';
import { buildTestImage } from '../helpers/images.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId } from '../helpers/server.js';
import { dockerSaveTar } from '../state/fixtures/oci.js';
import { api, startJoinedEdge, startReplicaPair, until, type ReplicaPair } from './support/replica-pair.js';

const skip = integrationSkipReason() ?? postgresSkipReason() ?? registrySkipReason();

describe("the cluster's registry as the control plane's blob store", { skip, timeout: 240_000 }, () => {
  let registry: TestRegistry;
  let pair: ReplicaPair;
  let edge: RunningEdgeDaemon | undefined;
  const edgeDir = makeDataDir();
  const edgeId = newEdgeId();
  let repository: string;
  let reader: RegistryClient;
  const marker = `regblob-${randomBytes(6).toString('hex')}`;
  let image: ImageInfo;
  let archive: Buffer;
  const importAtA = (name: string): Promise<Response> =>
    fetch(`${pair.a.url}/v1/images/import?name=${name}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${pair.a.apiKey}`, 'content-type': 'application/x-tar' },
      body: archive,
    });

  before(async () => {
    registry = await startTestRegistry();
    repository = `${registry.host}/team/blobstore`;
    reader = new RegistryClient(parseRegistryRef(repository, { requireName: false }));
    pair = await startReplicaPair({ name: 'dsec_regblobs', registry: repository });
    edge = await startJoinedEdge(pair, { dataDir: edgeDir, id: edgeId, maxSandboxes: 8 });
  });

  after(async () => {
    await edge?.close({ killAll: true });
    await pair?.close();
    await assertCleanAndRemove(edgeDir, edgeId);
    await registry?.close();
  });

  const cached = (dataDir: string, digest: string): boolean =>
    existsSync(join(dataDir, 'layers', `${digest.slice('sha256:'.length)}.erofs`));

  test('an image imported at A is in the registry (layers and artifact) once it is recorded', async () => {
    archive = dockerSaveTar({
      layers: [
        [
          { name: 'bin/', type: 'dir' },
          { name: 'bin/busybox', data: readFileSync('/bin/busybox'), mode: 0o755 },
          { name: 'bin/sh', type: 'symlink', linkname: 'busybox' },
          { name: 'bin/cat', type: 'symlink', linkname: 'busybox' },
          { name: 'marker', data: marker },
        ],
      ],
      config: { Env: ['PATH=/bin'], Cmd: ['/bin/sh'] },
    });
    const res = await importAtA('regimp:v1');
    assert.equal(res.status, 201, await res.clone().text());
    image = ((await res.json()) as ImportImageResult).image;
    assert.equal(image.layers.length, 1);
    const layer = image.layers[0]!;
    assert.equal((await reader.headBlob(layer))?.size, image.sizeBytes, 'the layer is in the registry');
    const artifact = await reader.getManifest(imageTag(image.id as ImageId));
    assert.ok(artifact, `the image is in the registry as ${imageTag(image.id as ImageId)}`);
    assert.deepEqual(
      parseDsecManifest(artifact.bytes, artifact.mediaType, 'the artifact').layers.map((l) => l.digest),
      image.layers,
    );
    assert.ok(cached(pair.dataDirs[0], layer), 'A keeps the layer in its layer dir (its cache)');
    assert.ok(!cached(pair.dataDirs[1], layer), 'B has no copy: the replicas share no directory');
  });

  test('B serves it with no shared directory: inspect, a create on a crun edge that reads the registry, push elsewhere, blob GET', async () => {
    const layer = image.layers[0]!;
    const inspected = await api(pair.b, 'GET', '/v1/images/regimp:v1');
    assert.equal(inspected.status, 200, JSON.stringify(inspected.body));
    const atB = inspected.body as ImageInfo;
    assert.equal(atB.id, image.id);
    assert.equal(atB.sizeBytes, image.sizeBytes, "B knows the size from the image's record, without the bytes");

    const asked = registry.requests().length;
    const sb = await Sandbox.create({ url: pair.b.url, apiKey: pair.b.apiKey, image: 'regimp:v1' });
    try {
      assert.equal((await sb.commands.run('cat /marker')).stdout, marker);
    } finally {
      await sb.kill();
    }
    const gets = registry
      .requests()
      .slice(asked)
      .filter((l) => l.includes(`"GET /v2/team/blobstore/blobs/${layer} `) && / 200 /.test(l));
    assert.equal(gets.length, 1, `the edge read the layer from the registry once:\n${registry.requests().slice(asked).join('\n')}`);
    assert.ok(!cached(pair.dataDirs[1], layer), 'and B still has no copy: the edge did not read it through B');

    // Export: B pushes it to another repository, fetching the layer from the cluster's registry.
    const pushed = await api(pair.b, 'POST', '/v1/images/push', { image: 'regimp:v1', ref: `${registry.host}/team/exported:v1` });
    assert.equal(pushed.status, 200, JSON.stringify(pushed.body));
    assert.ok(
      await new RegistryClient(parseRegistryRef(`${registry.host}/team/exported`, { requireName: false })).headBlob(layer),
      'the other repository has the layer',
    );
    assert.ok(cached(pair.dataDirs[1], layer), 'B fetched it into its layer dir to push it');

    // The blob endpoint (edges without the registry, lazy nodes) serves the same bytes.
    const blob = await fetch(`${pair.b.url}/v1/blobs/${layer}`, { headers: { authorization: `Bearer ${pair.b.joinToken}` } });
    assert.equal(blob.status, 200);
    assert.equal(
      `sha256:${createHash('sha256')
        .update(Buffer.from(await blob.arrayBuffer()))
        .digest('hex')}`,
      layer,
    );
  });

  test('a snapshot recorded at B, whose new layer the edge gave to A and whose base layer B never fetched, starts at A', async () => {
    const sb = await Sandbox.create({ url: pair.b.url, apiKey: pair.b.apiKey, image: 'regimp:v1' });
    let snapId: string;
    try {
      await sb.commands.run('echo from-the-snapshot > /made-here');
      const snap = await sb.snapshot({ name: 'regsnap:v1' });
      snapId = snap.imageId;
      assert.equal(snap.layers.length, 2);
      assert.equal(snap.layers[0], image.layers[0]);
      for (const l of snap.layers) assert.ok(await reader.headBlob(l), `${l} of the snapshot is in the registry`);
    } finally {
      await sb.kill();
    }
    const fromA = await Sandbox.create({ url: pair.a.url, apiKey: pair.a.apiKey, image: 'regsnap:v1' });
    try {
      assert.equal((await fromA.commands.run('cat /made-here /marker')).stdout, `from-the-snapshot\n${marker}`);
    } finally {
      await fromA.kill();
    }
    assert.equal((await api(pair.b, 'DELETE', `/v1/images/${snapId}`)).status, 204);
  });

  test("deleted at A: its artifact is withdrawn, and GC at B deletes its blob in the registry (and B's copy)", async () => {
    const layer = image.layers[0]!;
    const busybox = ((await api(pair.b, 'GET', '/v1/images/busybox')).body as ImageInfo).layers[0]!;
    assert.equal((await api(pair.a, 'DELETE', `/v1/images/${image.id}`)).status, 204);
    assert.equal(await reader.getManifest(imageTag(image.id as ImageId)), undefined, 'the artifact is gone from the registry');
    await until(async () => ((await api(pair.b, 'GET', `/v1/images/${image.id}`)).status === 404 ? true : undefined));

    // No grace, so the test need not wait ten minutes; the route's GC keeps young blobs.
    const gc = await collectGarbage(pair.b.images, pair.b.store, Date.now(), 0, pair.b.control.registry);
    assert.ok(gc.removedLayers.includes(layer), JSON.stringify(gc));
    assert.equal(gc.keptByRegistry, 0);
    assert.equal(await reader.headBlob(layer), undefined, 'the blob is gone from the registry');
    assert.ok(!cached(pair.dataDirs[1], layer), "and from B's layer dir");
    assert.ok(!gc.removedLayers.includes(busybox), 'a layer an image uses stays');
    assert.ok(await reader.headBlob(busybox), 'in the registry too');

    // Imported again at A: the image is back for both replicas despite its delete, and its blob is
    // back in the registry (A put it there once before; GC at B deleted it since).
    const again = await importAtA('regimp:v2');
    assert.equal(again.status, 201, await again.clone().text());
    assert.equal(((await again.json()) as ImportImageResult).image.id, image.id);
    assert.ok(await reader.headBlob(layer), 'the blob is in the registry again');
    const atB = await until(async () => {
      const r = await api(pair.b, 'GET', '/v1/images/regimp:v2');
      return r.status === 200 ? (r.body as ImageInfo) : undefined;
    });
    assert.equal(atB.id, image.id);
    const blob = await fetch(`${pair.b.url}/v1/blobs/${layer}`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${pair.b.joinToken}` },
    });
    assert.equal(blob.status, 200, 'B serves it (from the registry)');
  });
});

describe('a cluster registry that refuses deletes', { skip: integrationSkipReason() ?? registrySkipReason(), timeout: 60_000 }, () => {
  test('GC keeps the blob there, counts it as keptByRegistry, and keeps its record for a later GC', async () => {
    const registry = await startTestRegistry({ deletes: false });
    const dir = makeDataDir();
    const store = await StateStore.open(join(dir, 'state.db'));
    try {
      const layers = new LayerStore(dir);
      const images = new ImageStore(dir, layers);
      const repository = `${registry.host}/team/keeps`;
      const blobs = new ClusterRegistry(
        repository,
        parseRegistryRef(repository, { requireName: false }),
        undefined,
        layers,
        store,
        pino({ level: 'silent' }),
      );
      layers.remote = blobs;
      await images.attachCatalog(new StoreImageCatalog(store), blobs);
      const built = await buildTestImage(images, 'keeps:v1', (root) => writeFileSync(`${root}/f`, 'kept'));
      await images.flush();
      const layer = images.get(built.id)!.layers[0]!;
      const reader = new RegistryClient(parseRegistryRef(repository, { requireName: false }));
      assert.ok(await reader.headBlob(layer), 'published when recorded');

      images.remove(built.id);
      await images.flush(); // the artifact's delete is refused too: logged, not thrown
      const gc = await collectGarbage(images, store, Date.now(), 0, blobs);
      assert.equal(gc.keptByRegistry, 1, JSON.stringify(gc));
      assert.ok(!gc.removedLayers.includes(layer));
      assert.ok(await reader.headBlob(layer), 'the registry still has the blob');
      assert.ok(
        (await blobs.stored()).some((b) => b.digest === layer),
        'its record stays for a GC once deletes are on',
      );
    } finally {
      // The registry first: a child left running keeps this file's process alive for good.
      await registry.close();
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
