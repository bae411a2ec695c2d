/**
 * The fast tier: trajectories in bulk (GET /v1/trajectories: by label, by batch, scoped to the
 * caller's project, killed sandboxes whose log is kept included) and a fork's lineage
 * (GET …/trajectory?lineage=true), in process against a SIMULATED edge. It runs no command, so
 * steps are appended through the control plane's trajectory log, as the exec and file services
 * do; forks go through the API, with the simulated edge given a snapshot that changes nothing.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import type { BatchInfo, ForkResult, SandboxInfo, Trajectory, TrajectoryLine } from '@dsec/sdk/schema';
import { SimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { createApiKey } from '../../src/control/api-keys.js';
import { ControlPlane } from '../../src/control/control-plane.js';
import { PortLinks } from '../../src/control/ports/port-links.js';
import { buildServer, type App } from '../../src/control/server.js';
import { StateStore } from '../../src/control/state-store.js';
import { TrajectoryExport } from '../../src/control/trajectory-export.js';
import { defaultImageConfig, ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';

const HOUR = 3600_000;

describe('fast tier: trajectories in bulk and a fork lineage, in process', () => {
  let dir: string;
  let store: StateStore;
  let control: ControlPlane;
  let app: App;
  const keys: Record<'admin' | 'a' | 'b', string> = { admin: '', a: '', b: '' };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-fast-traj-'));
    const log = pino({ level: 'silent' });
    store = await StateStore.open(':memory:');
    const layers = new LayerStore(join(dir, 'layers'));
    const images = new ImageStore(join(dir, 'images'), layers);
    const digest = await layers.addStream(Readable.from([Buffer.from('a placeholder layer: the simulated edge mounts nothing')]));
    images.tag('busybox', images.put({ layers: [digest], config: defaultImageConfig() }));
    control = new ControlPlane(store, images, log);
    const edge = new SimulatedEdge('fasttraj');
    // A fork is a snapshot and creates: the simulated edge snapshots nothing (the image stays the
    // parent's) and reports the default policy, which is all a fork needs of an edge.
    Object.assign(edge, {
      snapshotSandbox: async () => ({
        layer: null,
        baseLayers: [digest],
        config: defaultImageConfig(),
        stats: { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 },
        frozenMs: 0,
      }),
      getNetwork: async () => ({ policy: { mode: 'open', allow: [] } }),
    });
    await control.edges.addLocal('fasttraj', edge);
    app = await buildServer({
      control,
      store,
      images,
      log,
      clusterToken: 'dsecjoin_fast',
      links: new PortLinks('dsecjoin_fast'),
      portsOrigin: () => 'http://127.0.0.1:1',
      dataDir: dir,
    });
    keys.admin = (await createApiKey(store, 'admin', { admin: true })).key;
    for (const p of ['team-a', 'team-b']) assert.equal((await call('POST', '/v1/projects', keys.admin, { name: p })).statusCode, 201);
    keys.a = (await createApiKey(store, 'a', { project: 'team-a' })).key;
    keys.b = (await createApiKey(store, 'b', { project: 'team-b' })).key;
  });
  after(async () => {
    await app?.close();
    await store?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const call = (method: string, url: string, key?: string, body?: unknown) =>
    app.inject({
      method: method as 'GET',
      url,
      headers: key ? { authorization: `Bearer ${key}` } : {},
      ...(body === undefined ? {} : { payload: body as object }),
    });
  const create = async (key: string, labels: Record<string, string>): Promise<SandboxInfo> => {
    const res = await call('POST', '/v1/sandboxes', key, { image: 'busybox', resources: { memoryMiB: 64 }, labels });
    assert.equal(res.statusCode, 201, res.body);
    return res.json() as SandboxInfo;
  };
  /** `n` steps in a sandbox's log, as the exec service writes them (cmd names the sandbox and step). */
  const steps = async (id: string, n: number, tag = id): Promise<void> => {
    for (let i = 0; i < n; i++)
      await control.trajectory.append(id, { kind: 'exec', request: { cmd: ['echo', `${tag}:${i}`] }, exitCode: 0 });
  };
  const bulk = async (query: string, key: string): Promise<TrajectoryLine[]> => {
    const res = await call('GET', `/v1/trajectories?${query}`, key);
    assert.equal(res.statusCode, 200, res.body);
    assert.match(String(res.headers['content-type']), /application\/x-ndjson/);
    return res.body
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l) as TrajectoryLine);
  };
  /** The lines a stream of these sandboxes' logs must have: ids in order, each one's steps by seq. */
  const expected = (counts: Record<string, number>): string[] =>
    Object.keys(counts)
      .sort()
      .flatMap((id) => Array.from({ length: counts[id]! }, (_, i) => `${id}#${i + 1}`));
  const keysOf = (lines: TrajectoryLine[]): string[] => lines.map((l) => `${l.sandboxId}#${l.seq}`);

  test('by label: every label must match; lines are {sandboxId, …entry}, sandboxes by id, steps by seq', async () => {
    const x = await create(keys.a, { run: '7', arm: 'x' });
    const y = await create(keys.a, { run: '7', arm: 'y' });
    const other = await create(keys.a, { run: '8' });
    await steps(x.id, 3);
    await steps(y.id, 2);
    await steps(other.id, 1);
    const lines = await bulk('label=run=7', keys.a);
    assert.deepEqual(keysOf(lines), expected({ [x.id]: 3, [y.id]: 2 }));
    const first = lines.find((l) => l.sandboxId === x.id && l.seq === 1)!;
    assert.equal(first.kind, 'exec');
    assert.deepEqual(first.request, { cmd: ['echo', `${x.id}:0`] });
    assert.equal(first.exitCode, 0);
    assert.equal(first.replayable, true);
    assert.equal(Object.keys(lines[0]!)[0], 'sandboxId', 'the sandbox first, then the entry');
    assert.deepEqual(keysOf(await bulk('label=run=7&label=arm=y', keys.a)), expected({ [y.id]: 2 }));
    assert.deepEqual(await bulk('label=run=nosuch', keys.a), []);
  });

  test('project scope: a project key reads its own project only; an admin key every project, or the one it names', async () => {
    const a = await create(keys.a, { scope: 's1' });
    const b = await create(keys.b, { scope: 's1' });
    await steps(a.id, 2);
    await steps(b.id, 1);
    assert.deepEqual(keysOf(await bulk('label=scope=s1', keys.a)), expected({ [a.id]: 2 }));
    assert.deepEqual(keysOf(await bulk('label=scope=s1', keys.b)), expected({ [b.id]: 1 }));
    assert.deepEqual(keysOf(await bulk('label=scope=s1&project=team-a', keys.b)), expected({ [b.id]: 1 }), 'project= is for admin keys');
    assert.deepEqual(keysOf(await bulk('label=scope=s1', keys.admin)), expected({ [a.id]: 2, [b.id]: 1 }));
    assert.deepEqual(keysOf(await bulk('label=scope=s1&project=team-b', keys.admin)), expected({ [b.id]: 1 }));
  });

  test("killed sandboxes whose trajectory is kept are in; a tombstone's labels come from the sandbox it was", async () => {
    const live = await create(keys.a, { run: 'k' });
    const killed = await create(keys.a, { run: 'k' });
    await steps(live.id, 1);
    await steps(killed.id, 2);
    assert.equal((await call('DELETE', `/v1/sandboxes/${killed.id}`, keys.a)).statusCode, 204);
    assert.equal((await call('GET', `/v1/sandboxes/${killed.id}`, keys.a)).statusCode, 404);
    assert.deepEqual(keysOf(await bulk('label=run=k', keys.a)), expected({ [live.id]: 1, [killed.id]: 2 }));
    assert.deepEqual(await bulk('label=run=k', keys.b), [], "another project's killed sandbox stays out of sight");
    // Past the retention time its log goes, and with it from the stream.
    const later = Date.now() + 25 * HOUR;
    const exp = new TrajectoryExport({ store, trajectory: control.trajectory, ended: control.ended });
    assert.deepEqual(await exp.sandboxIds({ labels: { run: 'k' }, project: 'team-a' }, '', 10, later), [live.id]);
  });

  test('by batch (alone or with labels), live and killed items; an unknown or another project’s batch is 404 before the stream', async () => {
    const made = await call('POST', '/v1/batches', keys.a, {
      count: 3,
      spec: { image: 'busybox', resources: { memoryMiB: 64 }, labels: { job: 'b1' } },
    });
    assert.equal(made.statusCode, 202, made.body);
    const batch = made.json() as BatchInfo;
    for (let i = 0; i < 200; i++) {
      const info = (await call('GET', `/v1/batches/${batch.id}`, keys.a)).json() as BatchInfo;
      if (info.state !== 'running') break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const items = (
      (await call('GET', `/v1/sandboxes?label=dsec.batch=${batch.id}`, keys.a)).json() as { sandboxes: SandboxInfo[] }
    ).sandboxes.map((s) => s.id);
    assert.equal(items.length, 3);
    for (const [i, id] of items.entries()) await steps(id, i + 1);
    // The batch's label cannot be set by hand (it is dsec's own): no impostor joins the batch's
    // sandboxes by label; the batch filter reads the store's batch in any case.
    const impostor = await call('POST', '/v1/sandboxes', keys.a, { image: 'busybox', labels: { 'dsec.batch': batch.id, job: 'b1' } });
    assert.equal(impostor.statusCode, 400, impostor.body);
    assert.equal((impostor.json() as { error: { details: { field: string } } }).error.details.field, 'labels.dsec.batch');
    assert.equal((await call('DELETE', `/v1/sandboxes/${items[0]}`, keys.a)).statusCode, 204);
    const want = expected(Object.fromEntries(items.map((id, i) => [id, i + 1])));
    assert.deepEqual(keysOf(await bulk(`batch=${batch.id}`, keys.a)), want);
    assert.deepEqual(keysOf(await bulk(`batch=${batch.id}&label=job=b1`, keys.a)), want);
    assert.deepEqual(await bulk(`batch=${batch.id}&label=job=other`, keys.a), []);
    assert.deepEqual(keysOf(await bulk(`batch=${batch.id}`, keys.admin)), want);
    for (const [q, key] of [
      [`batch=${batch.id}`, keys.b],
      ['batch=batch-nosuch0', keys.a],
    ] as const) {
      const res = await call('GET', `/v1/trajectories?${q}`, key);
      assert.equal(res.statusCode, 404, res.body);
      assert.equal((res.json() as { error: { code: string } }).error.code, 'BATCH_NOT_FOUND');
    }
  });

  test('no label and no batch is a 400 that says what to pass; a malformed label too', async () => {
    for (const q of ['', '?project=team-a', '?label=novalue']) {
      const res = await call('GET', `/v1/trajectories${q}`, keys.a);
      assert.equal(res.statusCode, 400, `${q}: ${res.body}`);
      const err = (res.json() as { error: { code: string; message: string } }).error;
      assert.equal(err.code, 'INVALID_REQUEST');
      if (q !== '?label=novalue') assert.match(err.message, /label=KEY=VALUE.*batch=BATCH_ID/);
    }
    assert.equal((await call('GET', '/v1/trajectories?label=run=7')).statusCode, 401);
  });

  test('read a page at a time: small pages cross sandbox and entry boundaries and give the same lines', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const s = await create(keys.a, { paged: 'yes' });
      ids.push(s.id);
      await steps(s.id, i % 3 === 0 ? 0 : i + 2);
    }
    const whole = await bulk('label=paged=yes', keys.a);
    assert.equal(whole.length, 0 + 3 + 4 + 0 + 6, 'sandboxes with no steps add no line');
    for (const pages of [
      { sandboxes: 1, entries: 1 },
      { sandboxes: 2, entries: 3 },
      { sandboxes: 256, entries: 4 },
    ]) {
      const exp = new TrajectoryExport({ store, trajectory: control.trajectory, ended: control.ended, pages });
      const got: TrajectoryLine[] = [];
      for await (const l of exp.lines({ labels: { paged: 'yes' }, project: 'team-a' })) got.push(l);
      assert.deepEqual(got, whole, JSON.stringify(pages));
    }
  });

  describe('lineage', () => {
    const fork = async (id: string, key = keys.a): Promise<SandboxInfo> => {
      const res = await call('POST', `/v1/sandboxes/${id}/fork`, key, { count: 1 });
      assert.equal(res.statusCode, 201, res.body);
      const r = res.json() as ForkResult;
      assert.equal(r.sandboxes.length, 1, JSON.stringify(r.failures));
      return r.sandboxes[0]!;
    };
    const read = async (id: string, query = 'lineage=true', key = keys.a): Promise<Trajectory> => {
      const res = await call('GET', `/v1/sandboxes/${id}/trajectory?${query}`, key);
      assert.equal(res.statusCode, 200, res.body);
      return res.json() as Trajectory;
    };
    const at = (t: Trajectory): string[] => t.entries.map((e) => `${e.sandboxId}#${e.seq}`);

    test("a fork's log continues its parent's: ancestors up to each fork point, oldest first, then its own", async () => {
      const p = await create(keys.a, { lineage: 'l1' });
      await steps(p.id, 3);
      const c = await fork(p.id);
      assert.equal(c.labels['dsec.fork-of'], p.id);
      assert.equal(c.labels['dsec.fork-at-seq'], '3');
      await steps(p.id, 2, 'after the fork'); // the parent goes on: not the child's past
      await steps(c.id, 2);
      const g = await fork(c.id);
      assert.equal(g.labels['dsec.fork-of'], c.id);
      assert.equal(g.labels['dsec.fork-at-seq'], '2');
      await steps(g.id, 1);

      const t = await read(g.id);
      assert.deepEqual(at(t), [`${p.id}#1`, `${p.id}#2`, `${p.id}#3`, `${c.id}#1`, `${c.id}#2`, `${g.id}#1`]);
      assert.deepEqual(t.lineageMissing, []);
      assert.equal(t.sandboxId, g.id);
      assert.deepEqual(t.entries[0]!.request, { cmd: ['echo', `${p.id}:0`] });

      const plain = await read(g.id, '');
      assert.deepEqual(
        plain.entries.map((e) => e.seq),
        [1],
      );
      assert.equal(plain.entries[0]!.sandboxId, undefined, 'without lineage the answer is as it was');
      assert.equal(plain.lineageMissing, undefined);

      // afterSeq pages the sandbox's own steps; the ancestors come on the first page only.
      await steps(g.id, 2);
      assert.deepEqual(at(await read(g.id, 'lineage=true&afterSeq=1')), [`${g.id}#2`, `${g.id}#3`]);
      assert.deepEqual(at(await read(g.id, 'lineage=true&limit=1')).slice(-2), [`${c.id}#2`, `${g.id}#1`]);
      // A sandbox that is no fork: its own steps, nothing missing.
      assert.deepEqual(
        at(await read(p.id)),
        [1, 2, 3, 4, 5].map((s) => `${p.id}#${s}`),
      );

      // A killed ancestor whose log is kept is still read (its tombstone keeps its labels) …
      assert.equal((await call('DELETE', `/v1/sandboxes/${c.id}`, keys.a)).statusCode, 204);
      assert.deepEqual(at(await read(g.id)).slice(0, 5), [`${p.id}#1`, `${p.id}#2`, `${p.id}#3`, `${c.id}#1`, `${c.id}#2`]);
      // … and one whose log is gone is named, not silently left out.
      await control.ended.expire(Date.now() + 25 * HOUR);
      const cut = await read(g.id);
      assert.deepEqual(
        at(cut),
        [1, 2, 3].map((s) => `${g.id}#${s}`),
      );
      assert.deepEqual(cut.lineageMissing, [c.id]);
    });

    test("labels set by hand read no other project's log, and a cycle ends the walk", async () => {
      const secret = await create(keys.a, { lineage: 'l2' });
      await steps(secret.id, 2);
      const spoof = await create(keys.b, { 'dsec.fork-of': secret.id, 'dsec.fork-at-seq': '2' });
      await steps(spoof.id, 1);
      const t = await read(spoof.id, 'lineage=true', keys.b);
      assert.deepEqual(at(t), [`${spoof.id}#1`]);
      assert.deepEqual(t.lineageMissing, [secret.id]);

      const one = await create(keys.a, { lineage: 'l3' });
      const two = await create(keys.a, { 'dsec.fork-of': one.id, 'dsec.fork-at-seq': '1' });
      await steps(one.id, 1);
      await steps(two.id, 1);
      // Cannot relabel a live sandbox through the API; the store is where a cycle could come from.
      await store.db.run('UPDATE sandboxes SET labels = ? WHERE id = ?', [
        JSON.stringify({ 'dsec.fork-of': two.id, 'dsec.fork-at-seq': '1' }),
        one.id,
      ]);
      const c = await read(two.id);
      assert.deepEqual(at(c), [`${one.id}#1`, `${two.id}#1`]);
      assert.deepEqual(c.lineageMissing, []);
    });

    test('a fork with no fork point (made before they were recorded) names its parent as missing', async () => {
      const p = await create(keys.a, { lineage: 'l4' });
      await steps(p.id, 1);
      const old = await create(keys.a, { 'dsec.fork-of': p.id });
      await steps(old.id, 1);
      const t = await read(old.id);
      assert.deepEqual(at(t), [`${old.id}#1`]);
      assert.deepEqual(t.lineageMissing, [p.id]);
    });
  });
});
