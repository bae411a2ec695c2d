/** The control plane's blob endpoint: edges fetch layers (whole or by range) and upload snapshot layers. */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

describe('blob endpoint', { skip: integrationSkipReason(), timeout: 60_000 }, () => {
  let server: TestServer;
  let token: string;
  let digest: string;
  let bytes: Buffer;

  before(async () => {
    server = await startTestServer();
    token = readFileSync(join(server.dataDir, 'cluster-token'), 'utf8').trim();
    digest = server.dsec.images.get(server.dsec.images.resolve('busybox')!)!.layers[0]!;
    bytes = readFileSync(server.dsec.images.layers.path(digest as `sha256:${string}`));
  });
  after(async () => {
    await server?.close();
  });

  const get = (path: string, init: RequestInit & { auth?: string | null } = {}): Promise<Response> => {
    const headers = new Headers(init.headers);
    if (init.auth !== null) headers.set('authorization', `Bearer ${init.auth ?? token}`);
    return fetch(`${server.url}${path}`, { ...init, headers });
  };

  test('GET with the cluster token returns the whole blob, which hashes to its digest', async () => {
    const res = await get(`/v1/blobs/${digest}`);
    assert.equal(res.status, 200);
    const body = Buffer.from(await res.arrayBuffer());
    assert.equal(`sha256:${createHash('sha256').update(body).digest('hex')}`, digest);
    assert.equal(res.headers.get('accept-ranges'), 'bytes');
  });

  test('a Range gives 206 with exactly those bytes; an API key works too', async () => {
    const res = await get(`/v1/blobs/${digest}`, { headers: { range: 'bytes=4096-8191' }, auth: server.apiKey });
    assert.equal(res.status, 206);
    assert.equal(res.headers.get('content-range'), `bytes 4096-8191/${bytes.length}`);
    assert.deepEqual(Buffer.from(await res.arrayBuffer()), bytes.subarray(4096, 8192));
  });

  test('HEAD gives the size; unsatisfiable ranges are 416; unknown blobs 404; no token 401', async () => {
    const head = await get(`/v1/blobs/${digest}`, { method: 'HEAD' });
    assert.equal(Number(head.headers.get('content-length')), bytes.length);
    const bad = await get(`/v1/blobs/${digest}`, { headers: { range: `bytes=${bytes.length + 10}-` } });
    assert.equal(bad.status, 416);
    assert.equal(((await bad.json()) as { error: { code: string } }).error.code, 'RANGE_NOT_SATISFIABLE');
    const missing = await get(`/v1/blobs/sha256:${'0'.repeat(64)}`);
    assert.equal(missing.status, 404);
    assert.equal(((await missing.json()) as { error: { code: string } }).error.code, 'BLOB_NOT_FOUND');
    assert.equal((await get(`/v1/blobs/${digest}`, { auth: null })).status, 401);
    assert.equal((await get(`/v1/blobs/${digest}`, { auth: 'dsecjoin_wrong' })).status, 401);
  });

  test('PUT stores a blob under its digest and refuses bytes that hash to something else', async () => {
    const data = Buffer.from(`a layer made on an edge ${Date.now()}`);
    const d = `sha256:${createHash('sha256').update(data).digest('hex')}`;
    const put = await get(`/v1/blobs/${d}`, { method: 'PUT', body: data, headers: { 'content-type': 'application/vnd.dsec.layer.erofs' } });
    assert.equal(put.status, 201);
    assert.deepEqual(readFileSync(server.dsec.images.layers.path(d as `sha256:${string}`)), data);
    const wrong = await get(`/v1/blobs/sha256:${'1'.repeat(64)}`, {
      method: 'PUT',
      body: data,
      headers: { 'content-type': 'application/vnd.dsec.layer.erofs' },
    });
    assert.equal(wrong.status, 400);
    assert.equal(server.dsec.images.layers.has(`sha256:${'1'.repeat(64)}`), false);
    server.dsec.images.layers.remove(d as `sha256:${string}`);
  });
});
