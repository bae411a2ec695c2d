/**
 * Warm pools against a real dsec: a pool fills with real sandboxes, creates naming it (or matching
 * its spec) claim ready ones, concurrent claims never share a sandbox, an unclaimed sandbox serves
 * no call, and a pool with its ready sandboxes survives a control-plane restart.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { NotFoundError, Pool, Sandbox, Volume } from '@dsec/sdk';
import type { PoolInfo } from '@dsec/sdk/schema';
import type { RunningDsec } from '../src/runtime/all-in-one.js';
import {
  assertCleanAndRemove,
  integrationSkipReason,
  makeDataDir,
  newEdgeId,
  startDsec,
  startTestServer,
  type TestServer,
} from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';

const skip = integrationSkipReason();
const spec = { image: 'busybox', resources: { memoryMiB: 64 } };

/** Polls until the pool has `ready` sandboxes ready and nothing in flight (no deadline of its own: the test's timeout is it). */
async function filled(name: string, ready: number, conn: { url: string; apiKey: string }): Promise<PoolInfo> {
  for (;;) {
    const { info: p } = await Pool.get(name, conn);
    if (p.ready >= ready && p.creating === 0) return p;
    if (p.refillFailures > 0) throw new Error(`pool ${name} failed to refill: ${p.lastRefillError}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function readyIds(name: string, conn: { url: string; apiKey: string }): Promise<string[]> {
  return (await Sandbox.list({ ...conn, labels: { 'dsec.pool-ready': name } })).map((s) => s.id).sort();
}

describe('warm pools', { skip, timeout: 180_000 }, () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => server?.close());

  test("a pool fills; a create naming it claims a ready sandbox, which then serves calls and carries the caller's labels", async () => {
    const { info: created } = await Pool.create({ ...server.conn, name: 'named', size: 2, ...spec });
    assert.equal(created.size, 2);
    const p = await filled('named', 2, server.conn);
    assert.equal(p.claims, 0);
    assert.ok(p.refillMsP50 !== undefined && p.refillMsP50 > 0, 'refill times are reported');
    const ready = await readyIds('named', server.conn);
    assert.equal(ready.length, 2);

    // An unclaimed sandbox serves no call: nobody can use it before the caller that claims it.
    expectWireError(await call(server, 'POST', `/v1/sandboxes/${ready[0]}/exec`, { json: { cmd: 'true' } }), 409, 'SANDBOX_NOT_RUNNING');
    // Red team round three: a link made for an unclaimed sandbox would open whichever project's
    // page claims it later; it is refused like exec is.
    expectWireError(
      await call(server, 'POST', `/v1/sandboxes/${ready[0]}/port-links`, { json: { port: 8080 } }),
      409,
      'SANDBOX_NOT_RUNNING',
    );

    const sb = await Sandbox.create({ ...server.conn, ...spec, pool: 'named', labels: { task: 't1' }, ttlSeconds: 600 });
    assert.ok(ready.includes(sb.id), `claimed ${sb.id}, one of the ready ${ready.join(', ')}`);
    assert.deepEqual(sb.info.labels, { task: 't1', 'dsec.pool': 'named' });
    assert.equal(sb.info.ttlSeconds, 600);
    const r = await sb.commands.run('echo claimed');
    assert.equal(r.stdout, 'claimed\n');
    const { info: after1 } = await Pool.get('named', server.conn);
    assert.equal(after1.claims, 1);
    assert.ok(after1.claimMsP50 !== undefined);
    await filled('named', 2, server.conn); // refilled in the background
    await sb.kill();
  });

  test("a create matching a pool's spec claims from it without naming it; a different spec does not", async () => {
    await Pool.create({ ...server.conn, name: 'matched', size: 1, image: 'busybox', resources: { memoryMiB: 72 } });
    await filled('matched', 1, server.conn);
    const [readyId] = await readyIds('matched', server.conn);
    const sb = await Sandbox.create({ ...server.conn, image: 'busybox', resources: { memoryMiB: 72 } });
    assert.equal(sb.id, readyId);
    assert.equal(sb.info.labels['dsec.pool'], 'matched');
    const other = await Sandbox.create({ ...server.conn, image: 'busybox', resources: { memoryMiB: 80 } });
    assert.equal(other.info.labels['dsec.pool'], undefined);
    // Red team round three: the pool's spec plus volumes once claimed a pool sandbox without the
    // mount (and without the volume's checks). A pool has no volumes: such a create is its own.
    await filled('matched', 1, server.conn);
    const vol = await Volume.create(`pooled-${Date.now().toString(36)}`, server.conn);
    const withVolume = await Sandbox.create({
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 72 },
      volumes: [{ name: vol.name, path: '/mnt/v' }],
    });
    assert.equal(withVolume.info.labels['dsec.pool'], undefined, 'not claimed from the pool');
    assert.equal(
      (await withVolume.commands.run(['sh', '-c', 'grep -c " /mnt/v " /proc/mounts'])).stdout.trim(),
      '1',
      'the volume is mounted',
    );
    await assert.rejects(
      Sandbox.create({
        ...server.conn,
        image: 'busybox',
        resources: { memoryMiB: 72 },
        volumes: [{ name: 'nosuch-volume', path: '/mnt/v' }],
      }),
      (e: unknown) => e instanceof NotFoundError && e.code === 'VOLUME_NOT_FOUND',
    );
    await sb.kill();
    await other.kill();
    await withVolume.kill();
    await vol.delete();
    await Pool.delete('matched', server.conn);
  });

  test('concurrent claims never share a sandbox; claims beyond the ready ones are misses created on demand', async () => {
    const pool = await Pool.create({ ...server.conn, name: 'rush', size: 3, image: 'busybox', resources: { memoryMiB: 88 } });
    assert.equal(pool.name, 'rush');
    await filled('rush', 3, server.conn);
    const before = (await Pool.get('rush', server.conn)).info.claims;
    const sbs = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        Sandbox.create({ ...server.conn, image: 'busybox', resources: { memoryMiB: 88 }, pool: 'rush', labels: { i: String(i) } }),
      ),
    );
    const ids = sbs.map((s) => s.id);
    assert.equal(new Set(ids).size, 8, 'every caller got its own sandbox');
    const { info: p } = await Pool.get('rush', server.conn);
    assert.equal(p.claims - before + p.misses, 8);
    assert.ok(p.claims - before >= 3, `the 3 ready sandboxes were claimed (claims ${p.claims - before}, misses ${p.misses})`);
    for (const [i, s] of sbs.entries()) assert.equal(s.info.labels['i'], String(i));
    await Promise.all(sbs.map((s) => s.kill()));
    assert.equal((await pool.refresh()).name, 'rush');
    await pool.delete(); // the handle Pool.create returned, as Volume's
    assert.deepEqual(await readyIds('rush', server.conn), [], 'deleting a pool kills its unclaimed sandboxes');
    await assert.rejects(Pool.get('rush', server.conn), (e: Error) => e instanceof NotFoundError);
  });

  test('bad pool requests are 4xx with the registry code', async () => {
    expectWireError(await call(server, 'GET', '/v1/pools/nope'), 404, 'POOL_NOT_FOUND');
    expectWireError(await call(server, 'DELETE', '/v1/pools/nope'), 404, 'POOL_NOT_FOUND');
    expectWireError(await call(server, 'POST', '/v1/sandboxes', { json: { image: 'busybox', pool: 'nope' } }), 404, 'POOL_NOT_FOUND');
    expectWireError(
      await call(server, 'POST', '/v1/pools', { json: { name: 'Bad Name', size: 1, image: 'busybox' } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/pools', { json: { name: 'noimg', size: 1, image: 'no-such-image' } }),
      404,
      'IMAGE_NOT_FOUND',
    );
    expectWireError(
      await call(server, 'POST', '/v1/pools', { json: { name: 'big', size: 100000, image: 'busybox' } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { 'dsec.pool-ready': 'named' } } }),
      400,
      'INVALID_REQUEST',
    );
    // Naming a pool with a spec that differs from it says which fields differ.
    const err = expectWireError(
      await call(server, 'POST', '/v1/sandboxes', { json: { image: 'busybox', pool: 'named', resources: { memoryMiB: 128 } } }),
      400,
      'INVALID_REQUEST',
    );
    assert.deepEqual(err.details['differ'], ['resources']);
    expectWireError(await call(server, 'POST', '/v1/pools', { json: { name: 'named', size: 1, ...spec } }), 409, 'POOL_EXISTS');
    assert.deepEqual(
      (await Pool.list(server.conn)).map((p) => p.name),
      ['named'],
    );
  });
});

describe('warm pools across a control-plane restart', { skip, timeout: 180_000 }, () => {
  const dataDir = makeDataDir();
  const edgeId = newEdgeId();
  let first: RunningDsec | undefined;
  let second: RunningDsec | undefined;
  after(async () => {
    await first?.close({ killAll: true });
    await second?.close({ killAll: true });
    await assertCleanAndRemove(dataDir, edgeId);
  });

  test('the pool and its ready sandboxes come back; a claim after the restart gets one of them', async () => {
    first = await startDsec(dataDir, { edgeId });
    const c1 = { url: first.url, apiKey: first.apiKey };
    await Pool.create({ ...c1, name: 'kept', size: 2, ...spec });
    await filled('kept', 2, c1);
    const ready = await readyIds('kept', c1);
    await first.close(); // sandboxes keep running
    second = await startDsec(dataDir, { edgeId });
    const c2 = { url: second.url, apiKey: second.apiKey };
    const { info: p } = await Pool.get('kept', c2);
    assert.equal(p.size, 2);
    assert.equal(p.ready, 2, 'the ready sandboxes were adopted, not remade');
    assert.deepEqual(await readyIds('kept', c2), ready);
    const sb = await Sandbox.create({ ...c2, ...spec, pool: 'kept' });
    assert.ok(ready.includes(sb.id));
    assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    await Pool.delete('kept', c2);
    const left = await Sandbox.list(c2);
    assert.deepEqual(
      left.map((s) => s.id),
      [sb.id],
      'the claimed sandbox stays; the unclaimed one went with the pool',
    );
  });
});
