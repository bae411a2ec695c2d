/** OpenAPI document, health, metrics, nodes and images routes. */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';

describe('system routes', { skip: integrationSkipReason(), timeout: 60_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('GET /v1/openapi.json with a key: 200 JSON with paths["/v1/sandboxes"]', async () => {
    const res = await call(server, 'GET', '/v1/openapi.json');
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /application\/json/);
    const doc = res.json as { openapi: string; paths: Record<string, Record<string, unknown>> };
    assert.match(doc.openapi, /^3\./);
    assert.ok(doc.paths['/v1/sandboxes'], 'paths has /v1/sandboxes');
    assert.ok(doc.paths['/v1/sandboxes']!['post'], 'create is documented');
    assert.ok(doc.paths['/v1/sandboxes']!['get'], 'list is documented');
  });

  test('the OpenAPI document covers exec and files', async () => {
    const doc = (await call(server, 'GET', '/v1/openapi.json')).json as { paths: Record<string, Record<string, unknown>> };
    const paths = Object.keys(doc.paths);
    assert.ok(
      paths.some((p) => /^\/v1\/sandboxes\/\{id\}\/exec$/.test(p)),
      `exec missing from ${paths.join(', ')}`,
    );
    assert.ok(
      paths.some((p) => /^\/v1\/sandboxes\/\{id\}\/files$/.test(p)),
      `files missing from ${paths.join(', ')}`,
    );
  });

  test('GET /v1/openapi.json without a key: 401 UNAUTHORIZED', async () => {
    expectWireError(await call(server, 'GET', '/v1/openapi.json', { key: null }), 401, 'UNAUTHORIZED');
  });

  test('GET /healthz without a key: 200', async () => {
    const res = await call(server, 'GET', '/healthz', { key: null });
    assert.equal(res.status, 200);
    assert.deepEqual(res.json, { ok: true });
  });

  test('GET /v1/nodes lists the one local edge with its capacity', async () => {
    const res = await call(server, 'GET', '/v1/nodes');
    assert.equal(res.status, 200);
    const nodes = (res.json as { nodes: { id: string; sandboxes: number; maxSandboxes: number }[] }).nodes;
    assert.equal(nodes.length, 1);
    assert.equal(nodes[0]!.id, server.edgeId);
    assert.equal(nodes[0]!.maxSandboxes, 4000);
    assert.equal(typeof nodes[0]!.sandboxes, 'number');
  });

  test('GET /v1/images lists the busybox image by name', async () => {
    const res = await call(server, 'GET', '/v1/images');
    assert.equal(res.status, 200);
    const images = (res.json as { images: { id: string; names: string[]; layers: string[]; sizeBytes: number }[] }).images;
    const busybox = images.find((i) => i.names.includes('busybox:latest'));
    assert.ok(busybox, `no busybox:latest in ${JSON.stringify(images.map((i) => i.names))}`);
    assert.match(busybox.id, /^sha256:[0-9a-f]{64}$/);
    assert.equal(busybox.layers.length, 1);
    assert.ok(busybox.sizeBytes > 0);
  });

  test('a sandbox can be created from the image id as well as its name', async () => {
    const id = server.dsec.images.resolve('busybox')!;
    const sb = await Sandbox.create({ ...server.conn, image: id });
    try {
      assert.equal(sb.info.imageId, id);
      assert.equal(sb.info.image, id);
    } finally {
      await sb.kill();
    }
  });

  test('POST /v1/images with an unknown builder: 400 INVALID_REQUEST', async () => {
    expectWireError(await call(server, 'POST', '/v1/images', { json: { builder: 'alpine' } }), 400, 'INVALID_REQUEST');
  });

  test('POST /v1/images busybox answers 201 with the (cached) image', async () => {
    const res = await call(server, 'POST', '/v1/images', { json: { builder: 'busybox' } });
    assert.equal(res.status, 201, res.text);
    assert.equal((res.json as { id: string }).id, server.dsec.images.resolve('busybox'));
  });
});
