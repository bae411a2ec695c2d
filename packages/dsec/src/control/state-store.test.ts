import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { StateStore, type SandboxFilter } from './state-store.js';
import Database from 'better-sqlite3';
import { TEST_STORE_POSTGRES, testStoreLocation } from '../../test/helpers/postgres.js';
import { sandboxRow } from '../../test/helpers/sandbox-row.js';
import { MIGRATIONS, migrate } from './store/migrations.js';
import { SqliteDb } from './store/sqlite-db.js';
import type { SqlValue } from './store/sql.js';

/*
 * The state store's records on either engine (DSEC_TEST_STORE=postgres runs this file on
 * PostgreSQL): one file because its tests share one store and its rows (the `before` below), and
 * each record's tests read that store after the others wrote it, as the control plane does.
 */

/** A sandbox record with these labels (test/helpers/sandbox-row.ts). */
function info(id: string, labels: Record<string, string>, extra: Record<string, unknown> = {}): SandboxInfo {
  return sandboxRow(id, { labels, ...extra });
}

/** The fields this test is about. */
function core(s: SandboxInfo | undefined): Record<string, unknown> | undefined {
  if (!s) return undefined;
  const { id, edge, backend, status, image, imageId, resources, labels, createdAt, reason } = s;
  return { id, edge, backend, status, image, imageId, resources, labels, createdAt, reason };
}

describe('StateStore sandboxes', () => {
  let dir: string;
  /** A store of the test's own in a file of `name` (the shared one's rows would change its counts), closed after `use`. */
  const withOwnStore = async (name: string, use: (s: StateStore) => Promise<void>): Promise<void> => {
    const s = await StateStore.open(await testStoreLocation(join(dir, name)));
    try {
      await use(s);
    } finally {
      await s.close();
    }
  };
  let store: StateStore;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-state-'));
    store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
    await store.sandboxes.insert(info('sb-local-aaaaaa', { team: 'a', 'dsec.io/run': 'r1' }, { createdAt: '2025-01-01T00:00:01.000Z' }));
    await store.sandboxes.insert(info('sb-local-bbbbbb', { team: 'b', 'dsec.io/run': 'r1' }, { createdAt: '2025-01-01T00:00:02.000Z' }));
    await store.sandboxes.insert(
      info('sb-other-cccccc', { team: 'a' }, { edge: 'other', status: 'failed', reason: 'boom', createdAt: '2025-01-01T00:00:03.000Z' }),
    );
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('a sandbox reads back as inserted', async () => {
    assert.deepEqual(
      core(await store.sandboxes.get('sb-local-aaaaaa')),
      core(info('sb-local-aaaaaa', { team: 'a', 'dsec.io/run': 'r1' }, { createdAt: '2025-01-01T00:00:01.000Z' })),
    );
  });

  test('an unknown id reads back undefined', async () => {
    assert.equal(await store.sandboxes.get('sb-local-zzzzzz'), undefined);
  });

  test('reason is present only when set', async () => {
    assert.equal('reason' in (await store.sandboxes.get('sb-local-aaaaaa'))!, false);
    assert.equal((await store.sandboxes.get('sb-other-cccccc'))!.reason, 'boom');
  });

  test('list is oldest first', async () => {
    assert.deepEqual(
      (await store.sandboxes.list()).map((s) => s.id),
      ['sb-local-aaaaaa', 'sb-local-bbbbbb', 'sb-other-cccccc'],
    );
  });

  test('list filters on one label', async () => {
    assert.deepEqual(
      (await store.sandboxes.list({ labels: { team: 'a' } })).map((s) => s.id),
      ['sb-local-aaaaaa', 'sb-other-cccccc'],
    );
  });

  test('list filters on several labels (all must match)', async () => {
    assert.deepEqual(
      (await store.sandboxes.list({ labels: { team: 'b', 'dsec.io/run': 'r1' } })).map((s) => s.id),
      ['sb-local-bbbbbb'],
    );
  });

  test('a label key with dots and slashes is matched as one key, not a JSON path', async () => {
    assert.equal((await store.sandboxes.list({ labels: { 'dsec.io/run': 'r1' } })).length, 2);
    assert.equal((await store.sandboxes.list({ labels: { dsec: 'r1' } })).length, 0);
  });

  test('list filters on status and edge', async () => {
    assert.deepEqual(
      (await store.sandboxes.list({ status: 'failed' })).map((s) => s.id),
      ['sb-other-cccccc'],
    );
    assert.deepEqual(
      (await store.sandboxes.list({ edge: 'local' })).map((s) => s.id),
      ['sb-local-aaaaaa', 'sb-local-bbbbbb'],
    );
  });

  test('a label value that differs does not match', async () => {
    assert.deepEqual(await store.sandboxes.list({ labels: { team: 'c' } }), []);
  });

  test('a label filter key with a backslash matches nothing (and does not throw)', async () => {
    assert.deepEqual(await store.sandboxes.list({ labels: { 'team\\': 'a' } }), []);
  });

  test('a label filter key with a double quote matches nothing, not the key without the quote', async () => {
    assert.deepEqual(await store.sandboxes.list({ labels: { 'te"am': 'a' } }), []);
  });

  test('a group whose last row cannot be written leaves none of its rows, labels or specs', async () => {
    await store.sandboxes.insert(info('sb-atom-000040', {}));
    const ids = Array.from({ length: 41 }, (_, i) => `sb-atom-${String(i).padStart(6, '0')}`);
    await assert.rejects(
      store.sandboxes.insertMany(ids.map((id) => ({ info: info(id, { grp: 'atom' }), spec: { image: 'busybox' } }))),
      'the id taken already fails the group',
    );
    assert.deepEqual(await store.sandboxes.list({ labels: { grp: 'atom' } }), []);
    assert.equal(await store.sandboxes.get(ids[0]!), undefined);
    assert.equal(await store.sandboxes.spec(ids[0]!), undefined);
    await store.sandboxes.delete('sb-atom-000040');
  });

  test('a group of 70 (three statement chunks): rows, labels and specs in, then settled only where still creating', async () => {
    const ids = Array.from({ length: 70 }, (_, i) => `sb-group-${String(i).padStart(6, '0')}`);
    const spec = { image: 'busybox', volumes: [{ name: 'grpvol', path: '/data' }] };
    await store.sandboxes.insertMany(
      ids.map((id, i) => ({
        info: info(id, { grp: 'g70', nth: String(i) }, { edge: 'group', status: 'creating' }),
        batch: { id: 'b-g70', index: i },
        spec,
      })),
      { owner: 'replica-a', until: Date.now() + 60_000 },
    );
    assert.equal((await store.sandboxes.list({ labels: { grp: 'g70' } })).length, 70);
    assert.deepEqual(await store.sandboxes.spec(ids[69]!), spec);
    assert.equal(await store.sandboxes.createOwner(ids[40]!), 'replica-a');
    assert.deepEqual(await store.volumes.users('grpvol'), ids, 'every row mounts the volume');
    assert.deepEqual(
      (await store.batches.sandboxes('b-g70')).map((r) => r.index).sort((a, b) => a - b),
      ids.map((_, i) => i),
    );
    // Meanwhile one edge was lost (its rows say so) and one sandbox was killed (its row is gone).
    await store.sandboxes.setStatus(ids[5]!, 'lost', 'edge gone');
    await store.sandboxes.setStatus(ids[64]!, 'lost', 'edge gone');
    await store.sandboxes.delete(ids[33]!);
    const kept = await store.sandboxes.setStatuses(ids.slice(0, 35).map((id) => ({ id, status: 'running' })));
    assert.deepEqual([...kept], [[ids[5], { status: 'lost', reason: 'edge gone' }]]);
    const settled = await store.sandboxes.settleCreates(ids.slice(35).map((id) => ({ id, status: 'failed', reason: 'no' })));
    assert.deepEqual(
      settled,
      ids.slice(35).map((id) => (id === ids[64] ? 'lost' : 'failed')),
    );
    const rows = await store.sandboxes.list({ labels: { grp: 'g70' } });
    assert.equal(rows.length, 69);
    assert.equal(rows.filter((r) => r.status === 'running').length, 33);
    assert.equal(rows.filter((r) => r.status === 'failed' && r.reason === 'no').length, 34);
    for (const id of ids) if (id !== ids[33]) await store.sandboxes.delete(id);
  });

  test("a batch's items keep no spec row: the spec is read from the batch's row; one saved later for an item wins; mounts stay per item", async () => {
    const spec = { image: 'busybox', volumes: [{ name: 'batchvol', path: '/data' }] };
    await store.batches.insert('batch-specs1', 2, { count: 2, spec }, '2025-01-01T00:00:00.000Z');
    const ids = ['sb-bspec-000000', 'sb-bspec-000001'];
    await store.sandboxes.insertMany(
      ids.map((id, i) => ({ info: info(id, { grp: 'bspec' }), batch: { id: 'batch-specs1', index: i }, spec, specOnBatch: true })),
    );
    const own = await store.db.all<{ id: string }>('SELECT id FROM sandbox_specs WHERE id IN (?, ?)', ids);
    assert.deepEqual(own, [], 'no spec row per item');
    assert.deepEqual(await store.sandboxes.spec(ids[0]!), spec);
    assert.deepEqual(await store.volumes.users('batchvol'), ids, 'each item mounts the volume');
    const moved = { ...spec, env: { A: '1' } };
    await store.sandboxes.saveSpec(ids[1]!, moved);
    assert.deepEqual(await store.sandboxes.spec(ids[1]!), moved);
    assert.deepEqual(await store.sandboxes.spec(ids[0]!), spec);
    for (const id of ids) await store.sandboxes.delete(id);
    assert.equal(await store.sandboxes.spec(ids[0]!), undefined, 'none once the row is gone');
  });

  test("a batch's events are kept as runs, one per write: a read after any seq gets exactly the later ones, in order", async () => {
    await store.batches.insert('batch-runs1', 5, {}, '2025-01-01T00:00:00.000Z');
    const ev = (seq: number) => ({ seq, type: seq % 2 ? 'placed' : 'running', at: '2025-01-01T00:00:00.000Z' });
    const runs = [[0, 1, 2], [3], [4, 5, 6, 7], [8, 9]];
    for (const r of runs) await store.batches.appendEvents([{ id: 'batch-runs1', events: r.map(ev) }]);
    const rows = await store.db.all<{ n: number }>('SELECT count(*) AS n FROM batch_event_runs WHERE batch_id = ?', ['batch-runs1']);
    assert.equal(Number(rows[0]?.n), runs.length);
    for (let after = -1; after <= 9; after++) {
      assert.deepEqual(
        (await store.batches.events('batch-runs1', after)).map((e) => e.seq),
        Array.from({ length: 9 - after }, (_, i) => after + 1 + i),
        `after ${after}`,
      );
    }
    const row = await store.batches.get('batch-runs1');
    assert.deepEqual({ placed: row?.placed, running: row?.running, lastSeq: row?.lastSeq }, { placed: 5, running: 5, lastSeq: 9 });
  });

  test('setStatus changes status and reason; a later setStatus without reason clears it', async () => {
    await store.sandboxes.insert(info('sb-local-dddddd', {}, { status: 'creating' }));
    await store.sandboxes.setStatus('sb-local-dddddd', 'failed', 'why');
    assert.equal((await store.sandboxes.get('sb-local-dddddd'))!.reason, 'why');
    await store.sandboxes.setStatus('sb-local-dddddd', 'running');
    assert.equal((await store.sandboxes.get('sb-local-dddddd'))!.status, 'running');
    assert.equal((await store.sandboxes.get('sb-local-dddddd'))!.reason, undefined);
  });

  test("create leases: renewed creates stay their replica's, unrenewed ones are abandoned, and a settle applies only to a row still creating", async () => {
    const t0 = 1_000_000;
    await store.sandboxes.insert(info('sb-local-lease1', {}, { status: 'creating' }), undefined, undefined, {
      owner: 'r1',
      until: t0 + 10_000,
    });
    await store.sandboxes.insert(info('sb-local-lease2', {}, { status: 'creating' }), undefined, undefined, {
      owner: 'r2',
      until: t0 + 10_000,
    });
    assert.deepEqual(await store.sandboxes.abandonedCreates(t0 + 5_000), []);
    assert.equal(await store.sandboxes.createOwner('sb-local-lease1'), 'r1');
    assert.equal(await store.sandboxes.renewCreates('r1', t0 + 20_000), 1);
    assert.deepEqual((await store.sandboxes.leasedCreates('local', t0 + 15_000)).has('sb-local-lease1'), true);
    assert.deepEqual(
      (await store.sandboxes.abandonedCreates(t0 + 15_000)).map((r) => [r.id, r.owner]),
      [['sb-local-lease2', 'r2']],
    );
    assert.equal(await store.sandboxes.settleCreate('sb-local-lease2', 'failed', 'taken over'), 'failed');
    assert.equal(await store.sandboxes.settleCreate('sb-local-lease2', 'running'), 'failed', 'a settled create is not settled again');
    assert.equal(
      (await store.sandboxes.setStatuses([{ id: 'sb-local-lease2', status: 'running' }])).get('sb-local-lease2')?.reason,
      'taken over',
    );
    assert.equal((await store.sandboxes.get('sb-local-lease2'))?.status, 'failed');
    assert.equal(await store.sandboxes.settleCreate('sb-local-lease1', 'running'), 'running');
    assert.equal(await store.sandboxes.renewCreates('r1', t0 + 30_000), 0, 'a running sandbox has no create lease to renew');
    assert.equal(await store.sandboxes.settleCreate('sb-local-nosuch', 'running'), undefined);
    for (const id of ['sb-local-lease1', 'sb-local-lease2']) await store.sandboxes.delete(id);
  });

  test(
    'the creates in flight, and pages of a project, an edge or a status, are read by index: no scan of every sandbox, no sort of them (SQLite plans)',
    { skip: TEST_STORE_POSTGRES && 'SQLite plans' },
    async () => {
      const plan = async (sql: string, params: readonly SqlValue[]): Promise<string> =>
        (await store.db.all<{ detail: string }>(`EXPLAIN QUERY PLAN ${sql}`, params)).map((r) => r.detail).join('; ');
      // The lookups of create leases (create-leases.ts) run every second; at 400,000 rows a scan
      // of the table would be a stall every request meets: a short range of the status index.
      for (const [sql, params] of [
        ["UPDATE sandboxes SET create_lease_until = ? WHERE create_owner = ? AND status = 'creating'", [1, 'r1']],
        ["SELECT id FROM sandboxes WHERE edge = ? AND status = 'creating' AND create_lease_until >= ?", ['local', 1]],
        [
          "SELECT id, edge, create_owner AS owner FROM sandboxes WHERE status = 'creating' AND create_lease_until IS NOT NULL AND create_lease_until < ? ORDER BY created_at",
          [1],
        ],
      ] as const) {
        const p = await plan(sql, params);
        assert.match(p, /USING (COVERING )?INDEX sandboxes_status_page \(status=\?/, `${sql}: ${p}`);
      }
      // A page of a project's sandboxes (a project key's every list), an edge's or a status's, first
      // and by cursor: one range of an index in list order. Sorting the project's rows for each page took
      // 22 ms a page at 100,000 (0.3–1 ms by the index).
      const plans: string[] = [];
      const values = store.db.values.bind(store.db);
      store.db.values = async (sql, params) => {
        plans.push(await plan(sql, params ?? []));
        return values(sql, params);
      };
      const first = await store.sandboxes.page({ project: 'default', limit: 1 });
      assert.ok(first.next, 'the test store has more than one sandbox');
      // Each list and the index its page must be one range of. A project's or an edge's with a
      // status too: by the project's or edge's, not the status's (every sandbox of that status).
      const cases: [SandboxFilter, string][] = [
        [{ project: 'default', limit: 1, after: first.next }, 'project'],
        [{ project: 'default', status: 'running', limit: 1 }, 'project'],
        [{ edge: 'local', limit: 1, after: first.next }, 'edge'],
        [{ edge: 'local', status: 'running', limit: 1 }, 'edge'],
        [{ status: 'running', limit: 1, after: first.next }, 'status'],
        [{ project: 'default', order: 'newest', limit: 1, after: first.next }, 'project'],
        [{ status: 'running', order: 'newest', limit: 1 }, 'status'],
      ];
      try {
        plans.length = 0;
        for (const [filter] of cases) await store.sandboxes.page(filter);
      } finally {
        store.db.values = values;
      }
      assert.equal(plans.length, cases.length);
      cases.forEach(([filter, by], i) => {
        const p = plans[i]!;
        assert.match(p, new RegExp(`^SEARCH s USING INDEX sandboxes_${by}_page \\(${by}=\\?`), `${JSON.stringify(filter)}: ${p}`);
        assert.doesNotMatch(p, /TEMP B-TREE/, `${JSON.stringify(filter)}: ${p}`);
      });
    },
  );

  test(
    'a create lease renewal skips a row another transaction holds (PostgreSQL: no wait, so no cycle with a group settle)',
    { skip: TEST_STORE_POSTGRES ? undefined : 'SQLite has one writer at a time: a renewal never meets a held row', timeout: 30_000 },
    async () => {
      const lease = { owner: 'r9', until: 5_000_000 };
      await store.sandboxes.insert(info('sb-local-held01', {}, { status: 'creating' }), undefined, undefined, lease);
      await store.sandboxes.insert(info('sb-local-held02', {}, { status: 'creating' }), undefined, undefined, lease);
      // The settle's transaction holds one row while the renewal runs on another connection.
      const renewed = await store.db.transaction(async (tx) => {
        await tx.run("UPDATE sandboxes SET reason = 'held' WHERE id = ?", ['sb-local-held01']);
        return store.sandboxes.renewCreates('r9', 6_000_000);
      });
      assert.equal(renewed, 1, 'the row not held is renewed; the held one is skipped rather than waited for');
      assert.equal(await store.sandboxes.renewCreates('r9', 7_000_000), 2, 'once free, both are renewed');
      for (const id of ['sb-local-held01', 'sb-local-held02']) await store.sandboxes.delete(id);
    },
  );

  test('moves: one at a time per sandbox, only of a live one; the row names one edge, the target only once committed; leases as creates', async () => {
    const t0 = 2_000_000;
    const lease = (owner: string, until: number): { owner: string; until: number } => ({ owner, until });
    await store.sandboxes.insert(info('sb-local-move01', {}, { layers: ['sha256:a'] }));
    await store.sandboxes.insert(info('sb-local-move02', {}, { status: 'failed', reason: 'gone' }));
    assert.equal(await store.moves.begin('sb-local-move02', 'other', lease('r1', t0)), false, 'only a running or paused sandbox moves');
    assert.equal(await store.moves.begin('sb-local-move01', 'local', lease('r1', t0)), false, 'not to the edge it is on');
    assert.equal(await store.moves.begin('sb-local-move01', 'other', lease('r1', t0 + 10_000), t0), true);
    assert.equal(await store.moves.begin('sb-local-move01', 'third', lease('r2', t0 + 10_000)), false, 'one move at a time');
    const moving = await store.sandboxes.get('sb-local-move01');
    assert.equal(moving?.edge, 'local', 'the row names its source until the commit');
    assert.deepEqual(moving?.migration, { to: 'other', since: new Date(t0).toISOString() });
    assert.deepEqual([...(await store.moves.leasedTo('other', t0 + 5_000))], ['sb-local-move01']);
    assert.deepEqual(await store.moves.abandoned(t0 + 5_000), []);
    assert.equal(await store.moves.renew('r1', t0 + 20_000), 1);
    assert.deepEqual(
      (await store.moves.abandoned(t0 + 25_000)).map((m) => [m.id, m.from, m.to, m.owner]),
      [['sb-local-move01', 'local', 'other', 'r1']],
    );
    await store.moves.stage('sb-local-move01', 'other', ['sha256:a', 'sha256:b']);
    assert.deepEqual((await store.sandboxes.get('sb-local-move01'))?.layers, ['sha256:a', 'sha256:b']);
    // Its source stopped reporting meanwhile: the watcher marked it lost; the commit makes it live on the target.
    await store.sandboxes.setStatus('sb-local-move01', 'lost', 'lost: no heartbeat');
    assert.equal(await store.moves.commit('sb-local-move01', 'third', ['sha256:a'], 'running'), false, 'only the move in flight commits');
    assert.equal(await store.moves.commit('sb-local-move01', 'other', ['sha256:a', 'sha256:b'], 'running'), true);
    const moved = await store.sandboxes.get('sb-local-move01');
    assert.deepEqual([moved?.edge, moved?.status, moved?.reason, moved?.migration], ['other', 'running', undefined, undefined]);
    assert.equal(await store.moves.commit('sb-local-move01', 'other', [], 'running'), false, 'a move commits once');
    // Given up: the row stays on its source.
    assert.equal(await store.moves.begin('sb-local-move01', 'local', lease('r1', t0)), true);
    await store.moves.abort('sb-local-move01', 'local');
    assert.deepEqual(
      [(await store.sandboxes.get('sb-local-move01'))?.edge, await store.moves.get('sb-local-move01')],
      ['other', undefined],
    );
    for (const id of ['sb-local-move01', 'sb-local-move02']) await store.sandboxes.delete(id);
  });

  test('sandboxes.delete removes it', async () => {
    await store.sandboxes.insert(info('sb-local-eeeeee', {}));
    await store.sandboxes.delete('sb-local-eeeeee');
    assert.equal(await store.sandboxes.get('sb-local-eeeeee'), undefined);
  });

  test('state survives closing and reopening the database', async () => {
    const file = join(dir, 'reopen.db');
    const a = await StateStore.open(await testStoreLocation(file));
    await a.sandboxes.insert(info('sb-local-ffffff', { k: 'v' }));
    await a.close();
    const b = await StateStore.open(await testStoreLocation(file));
    try {
      assert.deepEqual((await b.sandboxes.get('sb-local-ffffff'))?.labels, { k: 'v' });
    } finally {
      await b.close();
    }
  });

  test(
    'a state file from before the migration list is brought up to date when opened',
    { skip: TEST_STORE_POSTGRES ? 'a SQLite file format' : undefined },
    async () => {
      const file = join(dir, 'legacy.db');
      // The first release's tables, as an old dsec made them (no schema_migrations, fewer columns).
      const old = new Database(file);
      old.exec(`CREATE TABLE sandboxes (id TEXT PRIMARY KEY, edge TEXT NOT NULL, status TEXT NOT NULL, image TEXT NOT NULL, image_id TEXT NOT NULL,
      resources TEXT NOT NULL, labels TEXT NOT NULL, created_at TEXT NOT NULL, reason TEXT);
      INSERT INTO sandboxes VALUES ('sb-local-oldold', 'local', 'running', 'busybox', 'sha256:0', '{"cpu":1,"memoryMiB":64,"pids":64}', '{"k":"v"}', '2025-01-01T00:00:00.000Z', NULL);`);
      old.close();
      const store = await StateStore.open(file);
      try {
        const s = await store.sandboxes.get('sb-local-oldold');
        assert.deepEqual(s?.labels, { k: 'v' });
        assert.equal(s?.backend, 'container');
        assert.deepEqual(s?.layers, []);
        assert.deepEqual(
          (await store.db.all<{ id: number }>('SELECT id FROM schema_migrations ORDER BY id')).map((r) => r.id),
          MIGRATIONS.map((m) => m.id),
        );
      } finally {
        await store.close();
      }
    },
  );

  test(
    "migration 12 moves E2B's access token out of the labels and the stored spec into its column",
    { skip: TEST_STORE_POSTGRES ? 'opens a SQLite file at a chosen migration' : undefined },
    async () => {
      const file = join(dir, 'token-label.db');
      const before = new SqliteDb(file);
      await migrate(
        before,
        MIGRATIONS.filter((m) => m.id < 12),
      );
      // Rows as the dsec before it wrote them: the token among the labels and in the spec's.
      const labels = { 'e2b.template': 'base', 'e2b.access-token': 'secret-token', k: 'v' };
      for (const [id, l] of [
        ['sb-local-e2btok', labels],
        ['sb-local-plainn', { k: 'v' }],
      ] as const) {
        await before.run(
          `INSERT INTO sandboxes (id, edge, status, image, image_id, resources, labels, created_at) VALUES (?, 'local', 'running', 'base', 'sha256:0', '{}', ?, '2025-01-01T00:00:00.000Z')`,
          [id, JSON.stringify(l)],
        );
        await before.run('INSERT INTO sandbox_specs (id, spec) VALUES (?, ?)', [id, JSON.stringify({ image: 'base', labels: l })]);
      }
      await before.close();
      const store = await StateStore.open(file);
      try {
        assert.deepEqual((await store.sandboxes.get('sb-local-e2btok'))?.labels, { 'e2b.template': 'base', k: 'v' });
        assert.equal(await store.sandboxes.accessToken('sb-local-e2btok'), 'secret-token');
        assert.deepEqual(await store.sandboxes.spec('sb-local-e2btok'), { image: 'base', labels: { 'e2b.template': 'base', k: 'v' } });
        assert.equal(await store.sandboxes.accessToken('sb-local-plainn'), undefined);
        assert.deepEqual([...(await store.sandboxes.accessTokens())], [['sb-local-e2btok', 'secret-token']]);
        assert.deepEqual([...(await store.sandboxes.accessTokens('other'))], []);
      } finally {
        await store.close();
      }
    },
  );

  test('list pages oldest first with limit and the cursor it gives; by label from the label rows, which go with the row', async () => {
    await withOwnStore('pages.db', async (s) => {
      for (let i = 0; i < 5; i++)
        await s.sandboxes.insert(info(`sb-local-page0${i}`, { run: i < 4 ? 'r' : 'x' }, { createdAt: `2025-01-01T00:00:0${i}.000Z` }));
      const p1 = await s.sandboxes.page({ labels: { run: 'r' }, limit: 3 });
      assert.deepEqual(
        p1.sandboxes.map((x) => x.id),
        ['sb-local-page00', 'sb-local-page01', 'sb-local-page02'],
      );
      assert.ok(p1.next);
      const p2 = await s.sandboxes.page({ labels: { run: 'r' }, limit: 3, after: p1.next });
      assert.deepEqual(
        p2.sandboxes.map((x) => x.id),
        ['sb-local-page03'],
      );
      assert.equal(p2.next, undefined);
      assert.deepEqual(await s.sandboxes.countByStatus(), { running: 5 });
      await s.sandboxes.setStatus('sb-local-page04', 'failed', 'x');
      assert.deepEqual(await s.sandboxes.countByStatus(), { running: 4, failed: 1 });
      assert.deepEqual(await s.sandboxes.countByStatus('other'), {});
      await s.sandboxes.delete('sb-local-page00');
      assert.equal((await s.db.all('SELECT * FROM sandbox_labels WHERE sandbox_id = ?', ['sb-local-page00'])).length, 0);
      assert.equal((await s.sandboxes.list({ labels: { run: 'r' } })).length, 3);
    });
  });

  test('list pages newest first (order: newest): every filter, page by page with its cursor, the oldest-first list backwards', async () => {
    await withOwnStore('pages-newest.db', async (s) => {
      for (let i = 0; i < 7; i++)
        await s.sandboxes.insert(
          info(
            `sb-local-newest${i}`,
            { run: i % 2 === 0 ? 'even' : 'odd' },
            { createdAt: `2025-01-01T00:00:0${i}.000Z`, edge: i < 5 ? 'local' : 'other' },
          ),
        );
      await s.sandboxes.setStatus('sb-local-newest3', 'paused');
      const all = async (filter: SandboxFilter): Promise<string[]> => {
        const ids: string[] = [];
        let after: string | undefined;
        do {
          const p = await s.sandboxes.page({ ...filter, limit: 2, ...(after ? { after } : {}) });
          ids.push(...p.sandboxes.map((x) => x.id));
          after = p.next;
        } while (after);
        return ids;
      };
      for (const filter of [
        {},
        { labels: { run: 'even' } },
        { edge: 'local' },
        { project: 'default' },
        { status: 'running' as const },
        { edge: 'local', status: 'running' as const },
      ]) {
        const oldest = (await s.sandboxes.list(filter)).map((x) => x.id);
        assert.ok(oldest.length >= 2, JSON.stringify(filter));
        assert.deepEqual(await all({ ...filter, order: 'newest' }), [...oldest].reverse(), JSON.stringify(filter));
        assert.deepEqual(await all(filter), oldest, JSON.stringify(filter));
      }
      assert.deepEqual(
        (await s.sandboxes.page({ order: 'newest', limit: 2 })).sandboxes.map((x) => x.id),
        ['sb-local-newest6', 'sb-local-newest5'],
      );
    });
  });

  test("a batch's counts are kept on its row as its events are written (once each), and survive a reopen", async () => {
    const file = join(dir, 'batch-counts.db');
    const a = await StateStore.open(await testStoreLocation(file));
    const ev = (seq: number, type: string) => ({ seq, type, at: '2025-01-01T00:00:00.000Z' });
    await a.batches.insert('batch-counts1', 3, {}, '2025-01-01T00:00:00.000Z');
    await a.batches.appendEvents([
      { id: 'batch-counts1', events: [ev(0, 'accepted'), ev(1, 'placed'), ev(2, 'running'), ev(3, 'placed')] },
    ]);
    // Written again (a driver resumed after a restart): not counted twice.
    await a.batches.appendEvents([{ id: 'batch-counts1', events: [ev(3, 'placed'), ev(4, 'failed')] }]);
    await a.close();
    const b = await StateStore.open(await testStoreLocation(file));
    try {
      const row = await b.batches.get('batch-counts1');
      assert.deepEqual(
        { placed: row?.placed, running: row?.running, failed: row?.failed, lastSeq: row?.lastSeq },
        { placed: 2, running: 1, failed: 1, lastSeq: 4 },
      );
      const events = await b.batches.events('batch-counts1', -1);
      assert.equal(events.filter((e) => e.type === 'placed').length, row?.placed);
    } finally {
      await b.close();
    }
  });

  test(
    'migration 15 fills the label rows and the batch counts of rows from before it',
    { skip: TEST_STORE_POSTGRES ? 'opens a SQLite file at a chosen migration' : undefined },
    async () => {
      const file = join(dir, 'm15.db');
      const before = new SqliteDb(file);
      await migrate(
        before,
        MIGRATIONS.filter((m) => m.id < 15),
      );
      await before.run(
        `INSERT INTO sandboxes (id, edge, status, image, image_id, resources, labels, created_at) VALUES ('sb-local-oldlab', 'local', 'running', 'b', 'sha256:0', '{}', '{"k":"v","a.b/c":"d"}', '2025-01-01T00:00:00.000Z')`,
      );
      await before.run(
        "INSERT INTO batches (id, count, spec, state, created_at) VALUES ('batch-oldold', 2, '{}', 'done', '2025-01-01T00:00:00.000Z')",
      );
      const events = [
        { seq: 0, type: 'accepted' },
        { seq: 1, type: 'placed', reason: '"type":"placed"' },
        { seq: 2, type: 'running' },
        { seq: 3, type: 'failed', reason: 'boom' },
        { seq: 4, type: 'done' },
      ];
      for (const e of events)
        await before.run('INSERT INTO batch_events (batch_id, seq, event) VALUES (?, ?, ?)', ['batch-oldold', e.seq, JSON.stringify(e)]);
      await before.close();
      const store = await StateStore.open(file);
      try {
        assert.deepEqual(
          (await store.sandboxes.list({ labels: { 'a.b/c': 'd', k: 'v' } })).map((x) => x.id),
          ['sb-local-oldlab'],
        );
        const row = await store.batches.get('batch-oldold');
        assert.deepEqual(
          { placed: row?.placed, running: row?.running, failed: row?.failed, lastSeq: row?.lastSeq },
          { placed: 1, running: 1, failed: 1, lastSeq: 4 },
        );
      } finally {
        await store.close();
      }
    },
  );

  test('volumes: one per name; the sandboxes that mount one, while they may hold it; rows go with the sandbox', async () => {
    const vol = { name: 'ds', project: 'default', edge: 'local', labels: { k: 'v' }, createdAt: '2025-01-01T00:00:00.000Z' };
    assert.equal(await store.volumes.insert(vol), true);
    assert.equal(await store.volumes.insert({ ...vol, edge: 'other' }), false);
    assert.deepEqual(await store.volumes.get('ds'), vol);
    await store.sandboxes.insert(info('sb-local-vvvvv1', {}), undefined, { image: 'busybox', volumes: [{ name: 'ds', path: '/d' }] });
    await store.sandboxes.insert(info('sb-local-vvvvv2', {}, { status: 'stopped' }), undefined, {
      image: 'busybox',
      volumes: [{ name: 'ds', path: '/d' }],
    });
    assert.deepEqual(await store.volumes.users('ds'), ['sb-local-vvvvv1'], 'a stopped sandbox holds no mount');
    await store.sandboxes.delete('sb-local-vvvvv1');
    await store.sandboxes.delete('sb-local-vvvvv2');
    assert.deepEqual(await store.volumes.users('ds'), []);
    assert.deepEqual(
      (await store.volumes.list()).map((v) => v.name),
      ['ds'],
    );
    await store.volumes.delete('ds');
    assert.equal(await store.volumes.get('ds'), undefined);
  });

  test("image owners: a name's owner and an id's owners read at once, as the single reads give them", async () => {
    const o = store.imageOwners;
    await o.setNameOwner('own/app:1', 'alpha');
    await o.add('sha256:own1', 'alpha');
    await o.add('sha256:own1', 'beta');
    const both = await o.owners('own/app:1', 'sha256:own1');
    assert.deepEqual([both.nameOwner, [...both.idOwners].sort()], ['alpha', ['alpha', 'beta']]);
    assert.deepEqual(
      [both.nameOwner, [...both.idOwners].sort()],
      [await o.nameOwner('own/app:1'), (await o.projects('sha256:own1')).sort()],
    );
    assert.equal((await o.owners(undefined, 'sha256:own1')).nameOwner, undefined, 'an id alone has no name owner');
    assert.deepEqual(await o.owners('own/other:1', 'sha256:none'), { nameOwner: undefined, idOwners: [] }, 'shared');
    await o.removeAll('sha256:own1');
    await o.removeNameOwner('own/app:1');
  });

  test('values: rows as arrays of their columns in the order selected, inside a transaction too', async () => {
    await store.sandboxes.insert(info('sb-vals-000001', { v: '1' }));
    const sql = 'SELECT status, id, ttl_seconds FROM sandboxes WHERE id = ?';
    assert.deepEqual(await store.db.values(sql, ['sb-vals-000001']), [['running', 'sb-vals-000001', null]]);
    assert.deepEqual(await store.db.transaction((tx) => tx.values(sql, ['sb-vals-000001'])), [['running', 'sb-vals-000001', null]]);
    assert.deepEqual(await store.db.values(sql, ['sb-vals-none']), []);
    await store.sandboxes.delete('sb-vals-000001');
  });

  test('the store is its record stores: no flat method beside close', () => {
    assert.deepEqual(Object.getOwnPropertyNames(StateStore.prototype).sort(), ['close', 'constructor']);
    assert.deepEqual(
      Object.keys(store)
        .filter((k) => k !== 'db')
        .sort(),
      ['batches', 'edges', 'imageOwners', 'keys', 'leases', 'moves', 'pools', 'projects', 'sandboxes', 'volumes'],
    );
  });

  test('sandbox counts are kept as rows are inserted, change status, edge or size, and go; they agree with a recount', async () => {
    await withOwnStore('counts.db', async (s) => {
      const recount = async (): Promise<string[]> =>
        (
          await s.db.all<{ status: string; edge: string; project: string; n: number }>(
            'SELECT status, edge, project, count(*) AS n FROM sandboxes GROUP BY status, edge, project',
          )
        )
          .map((r) => `${r.status}/${r.edge}/${r.project}=${Number(r.n)}`)
          .sort();
      const kept = async (): Promise<string[]> =>
        (await s.sandboxes.countGroups()).map((g) => `${g.status}/${g.edge}/${g.project}=${g.count}`).sort();
      await s.sandboxes.insert(info('sb-a-count01', {}, { edge: 'a' }));
      await s.sandboxes.insert(info('sb-a-count02', {}, { edge: 'a', project: 'p2', resources: { cpu: 0.5, memoryMiB: 128, pids: 64 } }));
      await s.sandboxes.insertMany([
        { info: info('sb-b-count03', {}, { edge: 'b', status: 'creating' }), spec: {} },
        { info: info('sb-b-count04', {}, { edge: 'b', status: 'creating' }), spec: {} },
      ]);
      assert.deepEqual(await kept(), ['creating/b/default=2', 'running/a/default=1', 'running/a/p2=1']);
      await s.sandboxes.setStatuses([{ id: 'sb-b-count03', status: 'running' }]);
      assert.equal(await s.sandboxes.settleCreate('sb-b-count04', 'failed', 'boom'), 'failed');
      await s.sandboxes.setStatus('sb-a-count01', 'running'); // no change: nothing counted twice
      await s.sandboxes.setStatus('sb-a-count02', 'paused');
      assert.equal(await s.moves.begin('sb-b-count03', 'c', { owner: 'r1', until: Date.now() + 10_000 }), true);
      assert.equal(await s.moves.commit('sb-b-count03', 'c', [], 'running'), true);
      assert.deepEqual(await kept(), await recount());
      assert.deepEqual(await kept(), ['failed/b/default=1', 'paused/a/p2=1', 'running/a/default=1', 'running/c/default=1']);
      assert.deepEqual(await s.sandboxes.countByStatus(), { running: 2, paused: 1, failed: 1 });
      assert.deepEqual(await s.sandboxes.countByStatus('p2'), { paused: 1 });
      // A project's usage counts its live sandboxes and their sizes (failed ones hold nothing).
      assert.deepEqual(await s.projects.usage('default'), { sandboxes: 2, cpu: 2, memoryMiB: 128 });
      assert.deepEqual(await s.projects.usage('p2'), { sandboxes: 1, cpu: 0.5, memoryMiB: 128 });
      await s.sandboxes.delete('sb-a-count02');
      await s.sandboxes.delete('sb-b-count04');
      assert.deepEqual(await kept(), await recount());
      assert.deepEqual(await s.sandboxes.countByStatus(), { running: 2 });
      assert.deepEqual(await s.projects.usage('p2'), { sandboxes: 0, cpu: 0, memoryMiB: 0 });
    });
  });

  test('expiry finds running sandboxes past their TTL or idle timeout, and paused ones past a TTL that stops them; nothing else', async () => {
    await withOwnStore('expiry.db', async (s) => {
      const now = Date.parse('2025-06-01T00:00:00.000Z');
      const at = (ms: number): string => new Date(ms).toISOString();
      await s.sandboxes.insert(info('sb-e-ttl-past', {}, { ttlSeconds: 60, expiresAt: at(now - 1) }));
      await s.sandboxes.insert(info('sb-e-ttl-later', {}, { ttlSeconds: 60, expiresAt: at(now + 60_000) }));
      await s.sandboxes.insert(info('sb-e-idle-past', {}, { idleTimeoutSeconds: 10, lastActivityAt: at(now - 11_000) }));
      await s.sandboxes.insert(info('sb-e-idle-fresh', {}, { idleTimeoutSeconds: 10, lastActivityAt: at(now - 1_000) }));
      await s.sandboxes.insert(info('sb-e-both-past', {}, { ttlSeconds: 1, expiresAt: at(now - 5), idleTimeoutSeconds: 1 }));
      await s.sandboxes.insert(info('sb-e-paused-stop', {}, { status: 'paused', ttlSeconds: 1, expiresAt: at(now - 5) }));
      await s.sandboxes.insert(
        info('sb-e-paused-pause', {}, { status: 'paused', onExpiry: 'pause', ttlSeconds: 1, expiresAt: at(now - 5) }),
      );
      await s.sandboxes.insert(info('sb-e-failed-past', {}, { status: 'failed', ttlSeconds: 1, expiresAt: at(now - 5) }));
      await s.sandboxes.insert(info('sb-e-no-limits', {}));
      const found = (await s.sandboxes.expired(now)).sort((a, b) => a.id.localeCompare(b.id));
      assert.deepEqual(
        found.map((e) => [e.id, e.onExpiry, e.why]),
        [
          ['sb-e-both-past', 'stop', 'ttl expired'],
          ['sb-e-idle-past', 'stop', 'idle for 10 s'],
          ['sb-e-paused-stop', 'stop', 'ttl expired'],
          ['sb-e-ttl-past', 'stop', 'ttl expired'],
        ],
      );
    });
  });

  test('a store from before the kept counts gets them counted from its rows at its upgrade', async () => {
    const location = await testStoreLocation(join(dir, 'counts-upgrade.db'));
    const before = MIGRATIONS.findIndex((m) => m.id === 17);
    const old = await StateStore.open(location);
    try {
      // Back to the schema before: its rows are written with no trigger to count them.
      await old.db.exec(
        TEST_STORE_POSTGRES
          ? 'DROP TRIGGER sandbox_counts_change ON sandboxes; DROP TABLE sandbox_count_deltas; DROP TABLE sandbox_counts'
          : 'DROP TRIGGER sandbox_counts_insert; DROP TRIGGER sandbox_counts_delete; DROP TRIGGER sandbox_counts_update; DROP TABLE sandbox_counts',
      );
      await old.db.exec('DROP INDEX sandboxes_expiry; DROP INDEX sandboxes_idle; DELETE FROM schema_migrations WHERE id = 17');
      await old.sandboxes.insert(info('sb-local-up01', {}));
      await old.sandboxes.insert(info('sb-other-up02', {}, { edge: 'other', status: 'failed' }));
      await migrate(old.db, MIGRATIONS.slice(0, before + 1));
      assert.deepEqual(await old.sandboxes.countByStatus(), { running: 1, failed: 1 });
      await old.sandboxes.setStatus('sb-local-up01', 'stopped');
      assert.deepEqual(await old.sandboxes.countByStatus(), { stopped: 1, failed: 1 });
    } finally {
      await old.close();
    }
  });

  test('opening a store again applies no migration twice', async () => {
    const file = join(dir, 'twice.db');
    const a = await StateStore.open(await testStoreLocation(file));
    const b = await StateStore.open(await testStoreLocation(file));
    try {
      assert.equal((await b.db.all('SELECT id FROM schema_migrations')).length, MIGRATIONS.length);
    } finally {
      await a.close();
      await b.close();
    }
  });
});

test("a batch another replica took over: the old owner's renewal says so, and its events are not written", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-batch-owner-'));
  const store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
  try {
    const now = Date.now();
    await store.batches.insert('bt1', 4, { count: 4 }, new Date(now).toISOString(), 'default', { id: 'a', until: now + 10_000 });
    assert.deepEqual(await store.batches.renew(['bt1'], 'a', now + 10_000), { cancel: [], lost: [] });
    assert.deepEqual(await store.batches.appendEvents([{ id: 'bt1', events: [{ seq: 0 }] }], 'a'), []);
    // A stalls past its lease; B claims the batch
    const claimed = await store.batches.claim('b', now + 40_000, now + 20_000);
    assert.deepEqual(
      claimed.map((c) => c.id),
      ['bt1'],
    );
    assert.deepEqual(await store.batches.renew(['bt1'], 'a', now + 30_000), { cancel: [], lost: ['bt1'] });
    assert.deepEqual(await store.batches.appendEvents([{ id: 'bt1', events: [{ seq: 1 }] }], 'a'), ['bt1'], "A's late events are refused");
    assert.deepEqual(await store.batches.appendEvents([{ id: 'bt1', events: [{ seq: 1 }, { seq: 2 }] }], 'b'), []);
    assert.deepEqual(
      (await store.batches.events('bt1', -1)).map((e) => e.seq),
      [0, 1, 2],
    );
    // B's renewal holds it, and a cancel request reaches B
    await store.batches.requestCancel('bt1');
    assert.deepEqual(await store.batches.renew(['bt1'], 'b', now + 50_000), { cancel: ['bt1'], lost: [] });
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'two transactions that lock the same rows in opposite orders both commit: the deadlock victim is run again',
  { skip: TEST_STORE_POSTGRES ? undefined : 'a PostgreSQL deadlock (SQLite runs one transaction at a time)' },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-deadlock-'));
    const store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
    try {
      const now = new Date().toISOString();
      for (const id of ['sb-local-dla', 'sb-local-dlb']) await store.sandboxes.insert(info(id, {}, { status: 'creating', createdAt: now }));
      // Each holds its first row until both have one: the second UPDATEs then wait on each other.
      let held = 0;
      let both!: () => void;
      const bothHeld = new Promise<void>((r) => (both = r));
      const tries = { a: 0, b: 0 };
      const lockInOrder = (first: string, second: string, who: 'a' | 'b') =>
        store.db.transaction(async (tx) => {
          tries[who]++;
          await tx.run('UPDATE sandboxes SET reason = ? WHERE id = ?', [who, first]);
          if (tries[who] === 1 && ++held === 2) both();
          if (tries[who] === 1) await bothHeld;
          await tx.run('UPDATE sandboxes SET reason = ? WHERE id = ?', [who, second]);
        });
      await Promise.all([lockInOrder('sb-local-dla', 'sb-local-dlb', 'a'), lockInOrder('sb-local-dlb', 'sb-local-dla', 'b')]);
      assert.equal(tries.a + tries.b, 3, `one of the two was the deadlock's victim and ran again (tries: ${JSON.stringify(tries)})`);
      const reasons = [(await store.sandboxes.get('sb-local-dla'))?.reason, (await store.sandboxes.get('sb-local-dlb'))?.reason];
      assert.equal(reasons[0], reasons[1], 'the transaction that ran last wrote both rows');
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
