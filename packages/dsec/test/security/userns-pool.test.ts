/**
 * User namespaces made ahead (edge/userns-pool.ts, edge option `usernsPool`): a create takes a
 * namespace the edge made before it was asked, with its uid range claimed host-wide the whole
 * time (for the pool, then handed over to the sandbox in one rename), and the pool refills in the
 * background. Here: creates really take pooled namespaces (the sandbox's init is in the very
 * namespace that was bound in the pool's dir), the pool refills, a sandbox made so has its
 * range's mapping and runs commands, creates beyond the pool make their own, a kill leaves
 * nothing, a graceful stop removes the pool, an opt-out edge has none, and after a kill -9 with
 * a full pool the next start leaves no bind, file or claim of it behind and creates work.
 */
import assert from 'node:assert/strict';
import { closeSync, existsSync, fstatSync, openSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { uidRangesOf } from '../../src/host/host-claims.js';
import type { SandboxRecord } from '../../src/edge/backends/container/sandbox-record.js';
import { DEFAULT_USERNS_POOL, UsernsPool } from '../../src/edge/backends/container/userns-pool.js';
import { hostRangeClaims, UidRangePool } from '../../src/host/uid-ranges.js';
import { pino } from 'pino';
import { spawnSync } from 'node:child_process';
import {
  assertCleanAndRemove,
  integrationSkipReason,
  makeDataDir,
  mountsBelow,
  newEdgeId,
  startDsec,
  startTestServer,
  TEST_USERNS,
  type TestServer,
} from '../helpers/server.js';
import { DsecUpChild } from '../reliability/dsec-up-child.js';
import { must } from './support/harness.js';

const skip =
  integrationSkipReason() ?? (TEST_USERNS ? undefined : 'DSEC_TEST_USERNS=0: sandboxes run without user namespaces, so without a pool');

const poolDirOf = (dataDir: string): string => join(dataDir, 'node', 'userns-pool');
const recordOf = (dataDir: string, id: string): SandboxRecord =>
  JSON.parse(readFileSync(join(dataDir, 'node', 'sandboxes', id, 'state.json'), 'utf8')) as SandboxRecord;
/** The user namespace a process is in, as the kernel names it (`user:[inode]`). */
const usernsOfPid = (pid: number): string => readlinkSync(`/proc/${pid}/ns/user`);
/** The user namespace bound on an nsfs file, named the same way (an nsfs file's inode is its namespace's). */
const usernsOfFile = (file: string): string => `user:[${statSync(file).ino}]`;

/** This edge's claims, as slot → holder (a sandbox id or a pooled namespace's `userns-pool.<n>`). */
function claimsOf(edgeId: string): Map<number, string> {
  return new Map(uidRangesOf(edgeId).map((c) => [c.slot, c.sandboxId]));
}

/** The pool's dir holds exactly its ready namespaces: one bind and one file per claim of a pool holder. */
function assertPoolConsistent(dataDir: string, edgeId: string, expectReady: number): void {
  const { files, binds, pooledClaims } = poolState(dataDir, edgeId);
  assert.equal(files.length, expectReady, `pool files: ${files.join(' ')}`);
  assert.deepEqual(binds, files, 'every pool file is a bound namespace and nothing else is mounted there');
  assert.deepEqual(pooledClaims, files, "the pool's claims are exactly its files' (each named after its claim's holder)");
}

function poolState(dataDir: string, edgeId: string): { files: string[]; binds: string[]; pooledClaims: string[] } {
  const dir = poolDirOf(dataDir);
  const files = existsSync(dir) ? readdirSync(dir).sort() : [];
  const binds = mountsBelow(dir)
    .map((mp) => mp.slice(dir.length + 1))
    .sort();
  const pooledClaims = [...claimsOf(edgeId).values()].filter((holder) => holder.startsWith('userns-pool.')).sort();
  return { files, binds, pooledClaims };
}

describe('user namespaces made ahead: creates take them, the pool refills', { skip, timeout: 300_000 }, () => {
  let server: TestServer;
  const edge = () => server.dsec.edge;

  before(async () => {
    server = await startTestServer();
    await edge().usernsPool.settled();
  });
  after(async () => {
    await server?.close();
  });

  test(`an idle edge keeps ${DEFAULT_USERNS_POOL} namespaces ready, each bound in the pool's dir with its range claimed for the pool`, () => {
    assert.equal(edge().usernsPool.ready, DEFAULT_USERNS_POOL);
    assertPoolConsistent(server.dataDir, server.edgeId, DEFAULT_USERNS_POOL);
  });

  test("a create takes a pooled namespace: the sandbox's init runs in it, as its range; the pool refills; kill leaves nothing", async () => {
    const holders = new Map([...claimsOf(server.edgeId)].map(([slot, holder]) => [holder, slot]));
    const pooled = new Map(
      edge()
        .usernsPool.files()
        .map((f) => [usernsOfFile(f), holders.get(f.slice(f.lastIndexOf('/') + 1))]),
    );
    assert.equal(pooled.size, DEFAULT_USERNS_POOL);
    const sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
    const rec = recordOf(server.dataDir, sb.id);
    const ns = usernsOfPid(rec.pid!);
    assert.ok(pooled.has(ns), `the sandbox's namespace ${ns} is none of the pooled ones ${[...pooled.keys()].join(' ')}`);
    assert.equal(rec.userns!.slot, pooled.get(ns), 'the sandbox got the range its namespace was made for');
    assert.equal(claimsOf(server.edgeId).get(rec.userns!.slot), sb.id, "the range's claim was handed over to the sandbox");
    // No behaviour change inside: root is 0 there, its range outside, and commands run.
    const r = await must(server, sb, ['sh', '-c', 'id -u; cat /proc/self/uid_map; cat /proc/self/gid_map; echo x > /tmp/f']);
    const [uid, uidMap, gidMap] = r.stdout.trim().split('\n');
    assert.equal(uid, '0');
    for (const map of [uidMap, gidMap]) assert.deepEqual(map!.trim().split(/\s+/).map(Number), [0, rec.userns!.base, rec.userns!.size]);
    assert.equal(statSync(join(server.dataDir, 'node', 'sandboxes', sb.id, 'upper', 'tmp', 'f')).uid, rec.userns!.base);
    assert.match(readFileSync(`/proc/${rec.pid!}/status`, 'utf8'), new RegExp(`\\nUid:\\t${rec.userns!.base}\\t`));
    // The refill, in the background: full again, with a namespace not handed out before.
    await edge().usernsPool.settled();
    assert.equal(edge().usernsPool.ready, DEFAULT_USERNS_POOL);
    assertPoolConsistent(server.dataDir, server.edgeId, DEFAULT_USERNS_POOL);
    for (const f of edge().usernsPool.files()) assert.notEqual(usernsOfFile(f), ns);
    await sb.kill();
    assert.deepEqual(mountsBelow(join(server.dataDir, 'node', 'sandboxes', sb.id)), []);
    assert.equal(existsSync(join(server.dataDir, 'node', 'sandboxes', sb.id)), false);
    assert.notEqual(claimsOf(server.edgeId).get(rec.userns!.slot), sb.id, "the range's claim outlived its sandbox");
    assertPoolConsistent(server.dataDir, server.edgeId, DEFAULT_USERNS_POOL);
  });

  test('more creates at once than the pool holds: the rest make their own; every range is disjoint and every mapping right', async () => {
    const pooled = new Set(edge().usernsPool.files().map(usernsOfFile));
    const n = DEFAULT_USERNS_POOL + 2;
    const sbs = await Promise.all(Array.from({ length: n }, () => Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } })));
    try {
      const recs = sbs.map((s) => recordOf(server.dataDir, s.id));
      const fromPool = recs.filter((r) => pooled.has(usernsOfPid(r.pid!))).length;
      assert.equal(fromPool, DEFAULT_USERNS_POOL, 'as many creates took a pooled namespace as were ready');
      const slots = new Set(recs.map((r) => r.userns!.slot));
      assert.equal(slots.size, n, `ranges shared: ${recs.map((r) => r.userns!.slot).join(' ')}`);
      for (const [i, s] of sbs.entries()) {
        const r = await must(server, s, ['cat', '/proc/self/uid_map']);
        assert.deepEqual(r.stdout.trim().split(/\s+/).map(Number), [0, recs[i]!.userns!.base, recs[i]!.userns!.size]);
        assert.equal(claimsOf(server.edgeId).get(recs[i]!.userns!.slot), s.id);
      }
      await edge().usernsPool.settled();
      assertPoolConsistent(server.dataDir, server.edgeId, DEFAULT_USERNS_POOL);
    } finally {
      await Promise.all(sbs.map((s) => s.kill()));
    }
  });

  test('a graceful stop removes the pool: no bind, no file, no claim of the edge', async () => {
    const s = await startTestServer();
    try {
      await s.dsec.edge.usernsPool.settled();
      assertPoolConsistent(s.dataDir, s.edgeId, DEFAULT_USERNS_POOL);
    } finally {
      await s.dsec.close(); // a failed check above must not leave the server running
    }
    try {
      assert.equal(existsSync(poolDirOf(s.dataDir)), false);
      assert.deepEqual(mountsBelow(poolDirOf(s.dataDir)), []);
      assert.deepEqual(uidRangesOf(s.edgeId), []);
    } finally {
      await assertCleanAndRemove(s.dataDir, s.edgeId);
    }
  });

  test('an opt-out edge (userns: false) and an edge with usernsPool 0 keep no pool', async () => {
    for (const opts of [{ userns: false }, { usernsPool: 0 }]) {
      const s = await startTestServer(opts);
      try {
        await s.dsec.edge.usernsPool.settled();
        assert.equal(s.dsec.edge.usernsPool.ready, 0, JSON.stringify(opts));
        assert.equal(existsSync(poolDirOf(s.dataDir)), false, JSON.stringify(opts));
        assert.deepEqual(uidRangesOf(s.edgeId), [], JSON.stringify(opts));
        // usernsPool 0: creates make their own namespace, as without a pool.
        const sb = await Sandbox.create({ ...s.conn, resources: { memoryMiB: 64 } });
        const rec = recordOf(s.dataDir, sb.id);
        assert.equal(rec.userns !== undefined, opts.userns !== false);
        assert.equal((await must(s, sb, ['true'])).exitCode, 0);
        await sb.kill();
      } finally {
        await s.close();
      }
    }
  });
});

describe('user namespaces made ahead: kill -9 of dsec up with a full pool', { skip, timeout: 300_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let up: DsecUpChild;

  const api = async (
    method: string,
    path: string,
    json?: unknown,
  ): Promise<{ status: number; body: { id?: string; sandboxes?: { id: string }[] } }> => {
    const res = await fetch(up.conn.url + path, {
      method,
      headers: { authorization: `Bearer ${up.conn.apiKey}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
      ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    });
    const text = await res.text();
    return { status: res.status, body: text ? (JSON.parse(text) as { id?: string }) : {} };
  };
  /** The pool of the child is filled in the background after its start: wait until it is (counted, not timed). */
  const poolFull = async (): Promise<void> => {
    const full = (): boolean => {
      const { files, binds, pooledClaims } = poolState(dataDir, edgeId);
      return files.length === DEFAULT_USERNS_POOL && files.join() === binds.join() && files.join() === pooledClaims.join();
    };
    for (let i = 0; i < 400 && !full(); i++) await new Promise((r) => setTimeout(r, 25));
    assertPoolConsistent(dataDir, edgeId, DEFAULT_USERNS_POOL);
  };
  const startWithPool = async (size: number | undefined): Promise<void> => {
    const saved = process.env['DSEC_USERNS_POOL'];
    if (size === undefined) delete process.env['DSEC_USERNS_POOL'];
    else process.env['DSEC_USERNS_POOL'] = String(size);
    try {
      await up.start(); // the child's env is this process's at spawn
    } finally {
      if (saved === undefined) delete process.env['DSEC_USERNS_POOL'];
      else process.env['DSEC_USERNS_POOL'] = saved;
    }
  };

  before(async () => {
    dataDir = makeDataDir();
    const first = await startDsec(dataDir, { edgeId }); // builds the busybox image once, in process
    await first.close({ killAll: true });
    up = new DsecUpChild(dataDir, edgeId);
    await startWithPool(undefined);
  });
  after(async () => {
    try {
      if (!up.running) await startWithPool(0);
      for (const s of (await api('GET', '/v1/sandboxes')).body.sandboxes ?? []) await api('DELETE', `/v1/sandboxes/${s.id}`);
      await up.stop();
    } finally {
      if (up?.running) await up.stop();
      if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
    }
  });

  test('the next start (pool off) leaves no bind, file or claim of the old pool; the adopted sandbox keeps its range; creates work', async () => {
    const a = await api('POST', '/v1/sandboxes', { image: 'busybox' });
    assert.equal(a.status, 201, JSON.stringify(a.body));
    const aId = a.body.id!;
    await poolFull();
    const aSlot = recordOf(dataDir, aId).userns!.slot;
    await up.crash();
    assertPoolConsistent(dataDir, edgeId, DEFAULT_USERNS_POOL); // control: the crash left a full pool
    await startWithPool(0);
    assert.equal(existsSync(poolDirOf(dataDir)), false, "the old pool's dir is still there");
    assert.deepEqual(mountsBelow(poolDirOf(dataDir)), [], 'a namespace of the old pool is still bound');
    assert.deepEqual([...claimsOf(edgeId)], [[aSlot, aId]], 'claims other than the adopted sandbox’s were left');
    assert.equal((await api('POST', `/v1/sandboxes/${aId}/exec`, { cmd: ['true'] })).status, 200);
    const b = await api('POST', '/v1/sandboxes', { image: 'busybox' });
    assert.equal(b.status, 201, JSON.stringify(b.body));
    assert.equal((await api('POST', `/v1/sandboxes/${b.body.id!}/exec`, { cmd: ['true'] })).status, 200);
    assert.notEqual(recordOf(dataDir, b.body.id!).userns!.slot, aSlot);
  });

  test('kill -9 again, restart with the default pool: a new full pool, no claim but the sandboxes’ and its own; a graceful stop then removes it', async () => {
    await up.stop(); // running with the pool off since the test above
    await startWithPool(undefined);
    await poolFull();
    // Held open here, the old pool's namespaces live on after the crash, so no new one can get
    // their numbers (the kernel reuses a freed namespace's inode number).
    const held = readdirSync(poolDirOf(dataDir)).map((f) => openSync(join(poolDirOf(dataDir), f), 'r'));
    try {
      const before = new Set(held.map((fd) => `user:[${fstatSync(fd).ino}]`));
      await up.crash();
      await startWithPool(undefined);
      await poolFull();
      for (const f of readdirSync(poolDirOf(dataDir)))
        assert.ok(!before.has(usernsOfFile(join(poolDirOf(dataDir), f))), 'a namespace of the crashed edge stayed in the pool');
    } finally {
      for (const fd of held) closeSync(fd);
    }
    const live = new Set(((await api('GET', '/v1/sandboxes')).body.sandboxes ?? []).map((s) => s.id));
    for (const [slot, holder] of claimsOf(edgeId))
      assert.ok(live.has(holder) || holder.startsWith('userns-pool.'), `claim ${slot} for ${holder}: neither a sandbox nor the pool`);
    const c = await api('POST', '/v1/sandboxes', { image: 'busybox' });
    assert.equal(c.status, 201, JSON.stringify(c.body));
    await up.stop(); // SIGTERM: sandboxes stay, the pool goes
    assert.equal(existsSync(poolDirOf(dataDir)), false);
    assert.deepEqual(mountsBelow(poolDirOf(dataDir)), []);
    assert.ok(
      [...claimsOf(edgeId).values()].every((h) => !h.startsWith('userns-pool.')),
      'a graceful stop left pool claims',
    );
  });
});

describe('a pooled namespace whose hand-over fails', { skip, timeout: 60_000 }, () => {
  test('is dropped (no bind, file or claim left), the error reaches the create, and the pool still closes', async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    const dir = join(dataDir, 'pool');
    // Real claims and namespaces; only the hand-over fails (a write to /run failing).
    const ranges = new UidRangePool(edgeId, {
      ...hostRangeClaims,
      handOver: () => {
        throw new Error('EIO: the claims dir failed');
      },
    });
    const pool = new UsernsPool({ dir, size: 1, ranges, spawner: undefined, log: pino({ level: 'silent' }) });
    try {
      pool.clearLeftovers();
      pool.refill();
      await pool.settled();
      assert.equal(pool.ready, 1);
      assert.throws(() => pool.take('sb-x'), /EIO/);
      assert.deepEqual(readdirSync(dir), [], 'the dropped namespace left its file');
      assert.deepEqual(mountsBelow(dir), [], 'the dropped namespace left its bind');
      assert.deepEqual(uidRangesOf(edgeId), [], 'the dropped namespace kept its range claimed');
    } finally {
      await pool.close();
      assert.deepEqual(uidRangesOf(edgeId), []);
      await assertCleanAndRemove(dataDir, edgeId);
    }
  });
});

describe('a bind in the pool dir that the pool lost track of', { skip, timeout: 60_000 }, () => {
  test("is removed at the pool's close, with the pool's own namespaces: no bind, file or claim left", async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    const dir = join(dataDir, 'pool');
    const ranges = new UidRangePool(edgeId, hostRangeClaims);
    const pool = new UsernsPool({ dir, size: 1, ranges, spawner: undefined, log: pino({ level: 'silent' }) });
    try {
      pool.clearLeftovers();
      pool.refill();
      await pool.settled();
      assert.equal(pool.ready, 1);
      // What a dsec-idmap left running by a killed dsec-spawn would leave: a namespace bound on a
      // file of the pool's dir that is none of its ready ones (here this process's own namespace).
      const stray = join(dir, 'userns-pool.stray-1');
      closeSync(openSync(stray, 'w', 0o400));
      const r = spawnSync('mount', ['--bind', '/proc/self/ns/user', stray], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      assert.equal(mountsBelow(dir).length, 2, 'the stray bind and the ready namespace');
    } finally {
      await pool.close();
    }
    assert.deepEqual(mountsBelow(dir), [], 'a bind was left in the pool dir');
    assert.equal(existsSync(dir), false);
    assert.deepEqual(uidRangesOf(edgeId), []);
    await assertCleanAndRemove(dataDir, edgeId);
  });
});
