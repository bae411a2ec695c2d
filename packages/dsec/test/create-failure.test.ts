/**
 * A create that fails rolls back everything it made on the host, tells the caller why, and leaves
 * a failed record the caller can inspect and delete.
 */
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { ConflictError, Sandbox, type SandboxInfo } from '@dsec/sdk';
import { findLeaks } from '../src/host/leak-check.js';
import type { LayerDigest } from '../src/image/layer-store.js';
import { buildTestImage } from './helpers/images.js';
import { integrationSkipReason, mountsBelow, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectSdkError, expectWireError } from './helpers/wire.js';

describe('failed create rolls back', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  const layerOf = (name: string): LayerDigest => server.dsec.images.get(server.dsec.images.resolve(name)!)!.layers[0]!;

  describe('a layer missing from the layer store', () => {
    let res: Awaited<ReturnType<typeof call>>;
    let sandboxId: string;

    before(async () => {
      await buildTestImage(server.dsec.images, 'missing-layer', (root) => {
        mkdirSync(`${root}/etc`);
        writeFileSync(`${root}/etc/hostname`, 'missing-layer\n');
      });
      const layer = layerOf('missing-layer');
      rmSync(server.dsec.images.layers.path(layer));
      res = await call(server, 'POST', '/v1/sandboxes', { json: { image: 'missing-layer', labels: { case: 'missing-layer' } } });
      sandboxId = (res.json as { error?: { details?: { sandboxId?: string } } }).error?.details?.sandboxId ?? '';
    });

    test('create answers 404 IMAGE_NOT_FOUND naming the missing layer and the sandbox id', () => {
      const e = expectWireError(res, 404, 'IMAGE_NOT_FOUND');
      assert.match(e.message, /layer sha256:[0-9a-f]{64} is not in the layer store/);
      assert.ok(sandboxId.startsWith(`sb-${server.edgeId}-`), `sandbox id ${sandboxId}`);
    });

    test('nothing of that sandbox is left on the host', async () => {
      assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [sandboxId] }), []);
    });

    test('the sandbox is listed as failed, with the reason', async () => {
      const list = await Sandbox.list({ ...server.conn, labels: { case: 'missing-layer' } });
      assert.equal(list.length, 1);
      assert.equal(list[0]!.id, sandboxId);
      assert.equal(list[0]!.status, 'failed');
      assert.match(list[0]!.reason ?? '', /not in the layer store/);
    });

    test('DELETE removes the failed sandbox', async () => {
      assert.equal((await call(server, 'DELETE', `/v1/sandboxes/${sandboxId}`)).status, 204);
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${sandboxId}`), 404, 'SANDBOX_NOT_FOUND');
      assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { case: 'missing-layer' } }), []);
    });
  });

  describe('crun failing to start the container (an image whose /proc is a file)', () => {
    let res: Awaited<ReturnType<typeof call>>;
    let sandboxId: string;
    let layer: LayerDigest;

    before(async () => {
      await buildTestImage(server.dsec.images, 'broken-proc', (root) => {
        for (const d of ['dev', 'sys', 'tmp', 'etc']) mkdirSync(`${root}/${d}`);
        writeFileSync(`${root}/proc`, 'not a directory');
      });
      layer = layerOf('broken-proc');
      res = await call(server, 'POST', '/v1/sandboxes', { json: { image: 'broken-proc', labels: { case: 'crun-fails' } } });
      sandboxId = (res.json as { error?: { details?: { sandboxId?: string } } }).error?.details?.sandboxId ?? '';
    });

    test('create answers 500 SANDBOX_CREATE_FAILED with a readable message', () => {
      const e = expectWireError(res, 500, 'SANDBOX_CREATE_FAILED');
      assert.match(e.message, /crun could not start the sandbox: \S/);
      assert.ok(sandboxId.startsWith(`sb-${server.edgeId}-`), `sandbox id ${sandboxId}`);
    });

    test("details carry crun's stderr (non-empty) and the tool", () => {
      const details = (res.json as { error: { details: Record<string, unknown> } }).error.details;
      assert.equal(details['tool'], 'crun');
      assert.equal(typeof details['stderr'], 'string');
      assert.ok((details['stderr'] as string).trim().length > 0, 'stderr is empty');
      assert.match(details['stderr'] as string, /proc/);
    });

    test('nothing of that sandbox is left on the host: mounts, cgroups, crun container, directory', async () => {
      assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [sandboxId] }), []);
    });

    test('the layer it mounted is released and unmounted', () => {
      assert.equal(server.dsec.edge.layerMounts.refCount(layer), 0);
      assert.deepEqual(mountsBelow(server.dsec.edge.layerMounts.mountPoint(layer)), []);
    });

    test('the sandbox is listed as failed, with the reason', async () => {
      const list = await Sandbox.list({ ...server.conn, labels: { case: 'crun-fails' } });
      assert.equal(list.length, 1);
      const info: SandboxInfo = list[0]!;
      assert.equal(info.id, sandboxId);
      assert.equal(info.status, 'failed');
      assert.match(info.reason ?? '', /crun/);
      const failed = await call(server, 'GET', '/v1/sandboxes?status=failed');
      assert.ok((failed.json as { sandboxes: SandboxInfo[] }).sandboxes.some((s) => s.id === sandboxId));
    });

    test('exec on the failed sandbox: 409 SANDBOX_NOT_RUNNING with the reason', async () => {
      const e = expectWireError(
        await call(server, 'POST', `/v1/sandboxes/${sandboxId}/exec`, { json: { cmd: 'true' } }),
        409,
        'SANDBOX_NOT_RUNNING',
      );
      assert.match(e.message, /failed/);
      const sb = await Sandbox.connect(sandboxId, server.conn);
      await expectSdkError(sb.commands.run('true'), ConflictError, 'SANDBOX_NOT_RUNNING');
    });

    test('files on the failed sandbox: 409 SANDBOX_NOT_RUNNING', async () => {
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${sandboxId}/files?path=/etc/x`), 409, 'SANDBOX_NOT_RUNNING');
      expectWireError(await call(server, 'PUT', `/v1/sandboxes/${sandboxId}/files?path=/etc/x`, { body: 'x' }), 409, 'SANDBOX_NOT_RUNNING');
    });

    test('DELETE removes the failed sandbox', async () => {
      assert.equal((await call(server, 'DELETE', `/v1/sandboxes/${sandboxId}`)).status, 204);
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${sandboxId}`), 404, 'SANDBOX_NOT_FOUND');
    });
  });

  test('a failed create does not disturb running sandboxes or later creates', async () => {
    const sb = await Sandbox.create({ ...server.conn });
    try {
      const failed = await call(server, 'POST', '/v1/sandboxes', { json: { image: 'broken-proc' } });
      const failedId = expectWireError(failed, 500, 'SANDBOX_CREATE_FAILED').details['sandboxId'] as string;
      assert.equal((await call(server, 'DELETE', `/v1/sandboxes/${failedId}`)).status, 204);
      assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
      const again = await Sandbox.create({ ...server.conn });
      await again.kill();
    } finally {
      await sb.kill();
    }
  });
});

describe('capacity', { skip: integrationSkipReason(), timeout: 60_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer({ maxSandboxes: 1 });
  });
  after(async () => {
    await server?.close();
  });

  test('a create over maxSandboxes: 503 CAPACITY_EXCEEDED, and no record is kept', async () => {
    const first = await Sandbox.create({ ...server.conn, labels: { cap: 'x' } });
    try {
      const res = await call(server, 'POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { cap: 'x' } } });
      expectWireError(res, 503, 'CAPACITY_EXCEEDED');
      const list = await Sandbox.list({ ...server.conn, labels: { cap: 'x' } });
      assert.deepEqual(
        list.map((s) => s.id),
        [first.id],
      );
    } finally {
      await first.kill();
    }
    const after = await Sandbox.create({ ...server.conn });
    await after.kill();
  });
});
