/**
 * Sandbox state over time against a real server: pause/resume keeps processes and their memory,
 * TTL and idle policies (also across a server restart), and image GC.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { collectGarbage } from '../../src/control/image-gc.js';
import type { StateStore } from '../../src/control/state-store.js';
import { buildTestImage } from '../helpers/images.js';
import {
  assertCleanAndRemove,
  integrationSkipReason,
  makeDataDir,
  newEdgeId,
  startDsec,
  startTestServer,
  type TestServer,
} from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';
import { SYSTEM } from '../../src/control/service/callers.js';

/** Polls until `fn` returns a value, or fails after `tries` (a bound on waiting, not a timing assertion). */
async function until<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, tries = 200, everyMs = 50): Promise<T> {
  for (let i = 0; i < tries; i++) {
    const v = await fn();
    if (v !== undefined) return v;
    await sleep(everyMs);
  }
  throw new Error(`gave up waiting for ${what}`);
}

describe('pause, resume, expiry', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('pause → exec answers 409 SANDBOX_NOT_RUNNING → resume → a background counter kept its memory and pid', async () => {
    const sb = await Sandbox.create({ ...server.conn, image: 'busybox' });
    try {
      // The counter lives in the shell's memory; the file only reports it.
      const proc = await sb.commands.start([
        'sh',
        '-c',
        'echo $$ > /tmp/pid; i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done',
      ]);
      const readCount = async (): Promise<number> => Number((await sb.files.readText('/tmp/count').catch(() => '0')).trim());
      await until('the counter to reach 10', async () => ((await readCount()) >= 10 ? true : undefined));
      const pid = (await sb.files.readText('/tmp/pid')).trim();
      await sb.pause();
      assert.equal(sb.info.status, 'paused');
      // Frozen: the counter does not move (read from the host side: the API refuses while paused).
      const upper = join(server.dataDir, 'node', 'sandboxes', sb.id, 'upper', 'tmp', 'count');
      const frozenAt = Number(readFileSync(upper, 'utf8').trim());
      await sleep(500);
      assert.equal(Number(readFileSync(upper, 'utf8').trim()), frozenAt, 'a paused sandbox runs nothing');
      const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: 'true' } });
      const err = expectWireError(res, 409, 'SANDBOX_NOT_RUNNING');
      assert.match(err.message, /paused/);
      await sb.resume();
      assert.equal(sb.info.status, 'running');
      const after = await until('the counter to move on', async () => {
        const c = await readCount();
        return c > frozenAt ? c : undefined;
      });
      assert.ok(after > frozenAt, `the counter went on from ${frozenAt} (memory kept), now ${after}`);
      assert.equal((await sb.files.readText('/tmp/pid')).trim(), pid);
      assert.equal((await sb.commands.run(`kill -0 ${pid} && echo alive`)).stdout.trim(), 'alive');
      assert.equal((await proc.output()).process.status, 'running');
    } finally {
      await sb.kill();
    }
  });

  test('TTL expiry stops the sandbox: status stopped, reason mentions the ttl', async () => {
    const sb = await Sandbox.create({ ...server.conn, image: 'busybox', ttlSeconds: 1 });
    const info = await until('the TTL to apply', async () => {
      const i = await sb.refresh();
      return i.status === 'running' ? undefined : i;
    });
    assert.equal(info.status, 'stopped');
    assert.match(info.reason ?? '', /ttl/);
    const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: 'true' } });
    expectWireError(res, 409, 'SANDBOX_NOT_RUNNING');
    await sb.kill(); // removes the record
  });

  test("idle timeout with onExpiry 'pause' pauses the sandbox, and it resumes", async () => {
    const sb = await Sandbox.create({ ...server.conn, image: 'busybox', idleTimeoutSeconds: 1, onExpiry: 'pause' });
    try {
      const info = await until('the idle timeout to apply', async () => {
        const i = await sb.refresh();
        return i.status === 'running' ? undefined : i;
      });
      assert.equal(info.status, 'paused');
      await sb.resume();
      assert.equal((await sb.commands.run('echo back')).stdout, 'back\n');
    } finally {
      await sb.kill();
    }
  });
});

describe('an expiry that passes while dsec is down', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  test('is applied at the next start', async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    let dsec = await startDsec(dataDir, { edgeId });
    try {
      const sb = await dsec.control.sandboxes.create(SYSTEM, { image: 'busybox', ttlSeconds: 2 });
      assert.equal(sb.status, 'running');
      await dsec.close(); // sandboxes outlive the server
      await sleep(2500);
      dsec = await startDsec(dataDir, { edgeId });
      const info = await dsec.control.sandboxes.get(SYSTEM, sb.id);
      assert.equal(info.status, 'stopped');
      assert.match(info.reason ?? '', /ttl/);
      assert.deepEqual(await dsec.edge.listSandboxes(), [], 'the expired sandbox was torn down');
    } finally {
      await dsec.close({ killAll: true });
      await assertCleanAndRemove(dataDir, edgeId);
    }
  });
});

describe('image GC', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let store: StateStore;

  before(async () => {
    server = await startTestServer();
    store = server.dsec.store; // the server's own: a second SQLite connection in this process can deadlock on its lock
  });
  after(async () => {
    await server?.close();
  });

  test('a deleted image’s layer goes only when older than the grace period', async () => {
    const images = server.dsec.images;
    const built = await buildTestImage(images, 'gc-victim', (root) => void root);
    const layer = images.get(built.id)!.layers[0]!;
    const del = await call(server, 'DELETE', `/v1/images/${built.id}`);
    assert.equal(del.status, 204);
    // Through the API: the blob is seconds old, inside the 10-minute grace period.
    const res = await call(server, 'POST', '/v1/images/gc');
    assert.equal(res.status, 200);
    assert.ok(!(res.json as { removedLayers: string[] }).removedLayers.includes(layer));
    assert.ok(images.layers.has(layer));
    // With a grace period of 0 it goes.
    const r = await collectGarbage(images, store, Date.now(), 0);
    assert.ok(r.removedLayers.includes(layer), JSON.stringify(r));
    assert.ok(!images.layers.has(layer));
    assert.ok(images.resolve('busybox'), 'images still referenced keep their layers');
    assert.ok(images.layers.has(images.get(images.resolve('busybox')!)!.layers[0]!));
  });

  test('a layer a running sandbox uses is never removed, even with its image deleted', async () => {
    const images = server.dsec.images;
    const built = await buildTestImage(images, 'gc-in-use', (root) => void root);
    const layer = images.get(built.id)!.layers[0]!;
    // The test image has no shell, but a sandbox of it stacked under busybox runs fine.
    const sb = await Sandbox.create({ ...server.conn, image: 'busybox', layers: [built.id] });
    try {
      images.remove(built.id);
      const r = await collectGarbage(images, store, Date.now(), 0);
      assert.ok(!r.removedLayers.includes(layer));
      assert.ok(images.layers.has(layer));
      assert.equal((await sb.commands.run('echo still')).stdout, 'still\n');
    } finally {
      await sb.kill();
    }
    const r = await collectGarbage(images, store, Date.now(), 0);
    assert.ok(r.removedLayers.includes(layer), 'once the sandbox is gone, the layer goes');
  });
});
