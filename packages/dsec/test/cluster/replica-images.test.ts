/**
 * Image records in the store: two control-plane replicas on one real PostgreSQL with one shared
 * layer directory (--layer-dir) see the same images. Replica A's data dir starts with file-based
 * images (as a dsec from before the store kept them), which A imports at its first start; replica
 * B, whose data dir is empty, lists them with the same ids, serves their blobs, and a name made or
 * removed at one replica is seen at the other. A runs in a child process; B in this process. Two
 * simulated edges (the edge protocol over HTTP, no crun) take the creates
 * (test/cluster/support/replica-pair.ts). About 15 s.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { ImageInfo, SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { postgresSkipReason } from '../helpers/postgres.js';
import { integrationSkipReason, makeDataDir } from '../helpers/server.js';
import { api, startReplicaPair, until, type Endpoint, type ReplicaPair } from './support/replica-pair.js';

const skip = integrationSkipReason() ?? postgresSkipReason();

async function images(at: Endpoint): Promise<ImageInfo[]> {
  return ((await api(at, 'GET', '/v1/images')).body as { images: ImageInfo[] }).images;
}

describe('image records shared by control-plane replicas', { skip, timeout: 120_000 }, () => {
  let dataDirs: [string, string];
  let layerDir: string;
  let pair: ReplicaPair;
  let a: Endpoint & { joinToken: string };
  let b: ReplicaPair['b'];
  let legacyId: string;
  const edges: RunningSimulatedEdge[] = [];

  before(async () => {
    const aDataDir = makeDataDir();
    layerDir = mkdtempSync('/var/tmp/dsec-test-layers-');
    // A's data dir as an older dsec left it: busybox and a second name, as files only.
    const files = new ImageStore(aDataDir, new LayerStore(layerDir));
    legacyId = (await buildBusyboxImage(files)).id;
    files.tag('legacy:v1', legacyId as `sha256:${string}`);
    assert.ok(existsSync(join(aDataDir, 'images', 'refs', 'legacy:v1')));

    pair = await startReplicaPair({ name: 'dsec_images', layerDir, aDataDir });
    ({ a, b, dataDirs } = pair);
    for (const id of ['imgone', 'imgtwo']) edges.push(await startSimulatedEdge({ join: pair.join, token: a.joinToken, id }));
  });

  after(async () => {
    for (const e of edges) await e.close();
    await pair?.close();
    if (layerDir) rmSync(layerDir, { recursive: true, force: true });
  });

  test("file-based images are imported at A's first start; B, with an empty data dir, sees them and serves their blobs", async () => {
    const atA = await images(a);
    const atB = await images(b);
    const named = (list: ImageInfo[], name: string): ImageInfo | undefined => list.find((i) => i.names.includes(name));
    assert.equal(named(atA, 'busybox:latest')?.id, legacyId, "A's busybox is the one from its files (its own build was a cache hit)");
    assert.equal(named(atB, 'busybox:latest')?.id, legacyId, 'B sees the same id');
    assert.equal(named(atB, 'legacy:v1')?.id, legacyId, 'and the second name');
    assert.deepEqual(named(atB, 'busybox:latest')?.layers, named(atA, 'busybox:latest')?.layers);
    // B keeps a copy as files in its own data dir, for the CLI there.
    assert.equal(readFileSync(join(dataDirs[1]!, 'images', 'refs', 'legacy:v1'), 'utf8').trim(), legacyId);
    const layer = named(atB, 'busybox:latest')!.layers[0]!;
    const blob = await fetch(`${b.url}/v1/blobs/${layer}`, { method: 'HEAD', headers: { authorization: `Bearer ${b.joinToken}` } });
    assert.equal(blob.status, 200, 'B serves the blob from the shared layer dir');
  });

  test('a name made at B is usable at A at once; removed at A, it is gone at B', async () => {
    const name = `shared-${randomBytes(3).toString('hex')}:v2`;
    b.images.tag(name, legacyId as `sha256:${string}`);
    await b.images.flush();
    // A has never heard of it: its create refreshes from the store on the miss.
    const made = await api(a, 'POST', '/v1/sandboxes', { image: name, labels: { case: 'images' } });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    assert.equal((made.body as SandboxInfo).imageId, legacyId);
    assert.equal((await api(a, 'DELETE', `/v1/sandboxes/${(made.body as SandboxInfo).id}`)).status, 204);

    assert.equal((await api(a, 'DELETE', `/v1/images/${name}`)).status, 204);
    assert.equal((await api(a, 'GET', `/v1/images/${name}`)).status, 404);
    // B drops it at its next refresh (every second), its file with it.
    await until(async () => ((await api(b, 'GET', `/v1/images/${name}`)).status === 404 ? true : undefined));
    assert.ok(!existsSync(join(dataDirs[1]!, 'images', 'refs', name)), "B's file of the name is gone too");
    assert.equal((await api(b, 'GET', '/v1/images/legacy:v1')).status, 200, 'other names stay');
  });

  test('a name deleted at B is not brought back by a stale file at A', async () => {
    const name = `doomed-${randomBytes(3).toString('hex')}:v1`;
    b.images.tag(name, legacyId as `sha256:${string}`);
    await b.images.flush();
    await until(async () => (existsSync(join(dataDirs[0]!, 'images', 'refs', name)) ? true : undefined)); // A wrote its copy
    const beforeDelete = new Date(Date.now() - 1000);
    b.images.untag(name);
    await b.images.flush();
    await until(async () => (!existsSync(join(dataDirs[0]!, 'images', 'refs', name)) ? true : undefined));
    // The file as a replica that was down meanwhile still has it (written before the delete): A
    // imports it, the store's tombstone refuses it, and A deletes the file.
    writeFileSync(join(dataDirs[0]!, 'images', 'refs', name), legacyId);
    utimesSync(join(dataDirs[0]!, 'images', 'refs', name), beforeDelete, beforeDelete);
    await until(async () => (!existsSync(join(dataDirs[0]!, 'images', 'refs', name)) ? true : undefined));
    assert.equal((await api(a, 'GET', `/v1/images/${name}`)).status, 404);
    assert.equal((await api(b, 'GET', `/v1/images/${name}`)).status, 404);
  });

  test('a name deleted at B and made again since by a tool at A (its file written after the delete) is back at both', async () => {
    const name = `reborn-${randomBytes(3).toString('hex')}:v1`;
    b.images.tag(name, legacyId as `sha256:${string}`);
    await b.images.flush();
    await until(async () => (existsSync(join(dataDirs[0]!, 'images', 'refs', name)) ? true : undefined));
    b.images.untag(name);
    await b.images.flush();
    await until(async () => (!existsSync(join(dataDirs[0]!, 'images', 'refs', name)) ? true : undefined));
    // `dsec image tag` (or a build or import job) at A writes the name again, after the delete.
    writeFileSync(join(dataDirs[0]!, 'images', 'refs', name), legacyId);
    await until(async () => ((await api(b, 'GET', `/v1/images/${name}`)).status === 200 ? true : undefined));
    assert.equal((await api(a, 'GET', `/v1/images/${name}`)).status, 200);
  });
});
