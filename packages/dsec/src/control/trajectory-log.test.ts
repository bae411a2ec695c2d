import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { StateStore } from './state-store.js';
import { TEST_STORE_POSTGRES, testStoreLocation } from '../../test/helpers/postgres.js';
import { sandboxRow } from '../../test/helpers/sandbox-row.js';
import { MAX_ENTRIES, TrajectoryLog } from './trajectory-log.js';

const info = (id: string): SandboxInfo => sandboxRow(id);

describe('TrajectoryLog', () => {
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-trajectory-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a step that ends after its sandbox was deleted leaves no orphan row', async () => {
    const store = await StateStore.open(await testStoreLocation(join(dir, 'orphan.db')));
    const log = new TrajectoryLog(store);
    await store.sandboxes.insert(info('sb-a'));
    await log.append('sb-a', { kind: 'exec', request: { cmd: ['true'] } });
    await store.sandboxes.delete('sb-a');
    // A terminal's exit or a stream's final entry arriving after the kill:
    await log.append('sb-a', { kind: 'pty', request: {}, exitCode: 0, replayable: false });
    const rows = (await store.db.get<{ n: number }>('SELECT count(*) AS n FROM trajectory WHERE sandbox_id = ?', ['sb-a']))!;
    assert.equal(rows.n, 0);
    await store.close();
  });

  test("a sandbox's payloads are kept up to their total; past it a step is logged without its payload, unreplayable, and a copy counts its own", async () => {
    const store = await StateStore.open(await testStoreLocation(join(dir, 'payloads.db')));
    const log = new TrajectoryLog(store, 10);
    await store.sandboxes.insert(info('sb-p'));
    const write = (n: number): Promise<void> =>
      log.append('sb-p', { kind: 'files.write', request: { path: `/f${n}` }, payload: Buffer.alloc(n, 1) });
    await write(4);
    await write(6); // 10: at the total
    await write(1); // past it
    await log.append('sb-p', { kind: 'exec', request: { cmd: ['true'] } }); // no payload: replayable as ever
    const kept = await store.db.all<{ seq: number; n: number | null; replayable: number }>(
      'SELECT seq, length(payload) AS n, replayable FROM trajectory WHERE sandbox_id = ? ORDER BY seq',
      ['sb-p'],
    );
    assert.deepEqual(
      kept.map((r) => [r.seq, r.n === null ? null : Number(r.n), r.replayable]),
      [
        [1, 4, 1],
        [2, 6, 1],
        [3, null, 0],
        [4, null, 1],
      ],
    );
    await store.sandboxes.insert(info('sb-q'));
    await log.copy('sb-p', 'sb-q');
    await log.append('sb-q', { kind: 'files.write', request: { path: '/g' }, payload: Buffer.alloc(1) });
    const last = (await log.list('sb-q', 4)).entries;
    assert.deepEqual(
      last.map((e) => [e.seq, e.replayable]),
      [[5, false]],
      'the copy holds 10 bytes of payloads already',
    );
    await store.close();
  });

  test('orphan rows an older dsec left are removed when the store opens', async () => {
    const file = join(dir, 'old.db');
    const first = await StateStore.open(await testStoreLocation(file));
    await first.db.run(
      "INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-gone', 1, '2025-01-01T00:00:00Z', 'exec', '{}', 1)",
    );
    await first.close();
    const second = await StateStore.open(await testStoreLocation(file));
    const rows = (await second.db.get<{ n: number }>('SELECT count(*) AS n FROM trajectory'))!;
    assert.equal(rows.n, 0);
    await second.close();
  });

  test('the dropped count survives a restart of the control plane', async () => {
    const file = join(dir, 'dropped.db');
    const store = await StateStore.open(await testStoreLocation(file));
    await store.sandboxes.insert(info('sb-full'));
    await store.db.transaction(async (tx) => {
      for (let seq = 1; seq <= MAX_ENTRIES; seq++) {
        await tx.run(
          "INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-full', ?, '2025-01-01T00:00:00Z', 'exec', '{}', 1)",
          [seq],
        );
      }
    });
    const log = new TrajectoryLog(store);
    await log.append('sb-full', { kind: 'exec', request: {} });
    await log.append('sb-full', { kind: 'exec', request: {} });
    assert.equal((await log.list('sb-full', 0, 1)).dropped, 2);
    await store.close();
    const reopened = await StateStore.open(await testStoreLocation(file));
    assert.equal((await new TrajectoryLog(reopened).list('sb-full', 0, 1)).dropped, 2);
    await reopened.close();
  });

  // Replicas share PostgreSQL; a SQLite file has one control plane (better-sqlite3 waits for a
  // lock synchronously, so two connections in one process would block each other's event loop).
  const replicasSkip = TEST_STORE_POSTGRES ? undefined : 'replicas run on PostgreSQL (DSEC_TEST_STORE=postgres runs this)';
  test(
    'two stores on one database (two replicas) appending to one sandbox at once get seq 1..n, no gap, no repeat',
    { skip: replicasSkip },
    async () => {
      const file = join(dir, 'replicas.db');
      const a = await StateStore.open(await testStoreLocation(file));
      const b = await StateStore.open(await testStoreLocation(file));
      try {
        await a.sandboxes.insert(info('sb-busy'));
        const logs = [new TrajectoryLog(a), new TrajectoryLog(b)];
        await Promise.all(Array.from({ length: 40 }, (_, i) => logs[i % 2]!.append('sb-busy', { kind: 'exec', request: { i } })));
        const { entries } = await logs[0]!.list('sb-busy');
        assert.deepEqual(
          entries.map((e) => e.seq),
          Array.from({ length: 40 }, (_, i) => i + 1),
        );
        assert.equal(new Set(entries.map((e) => e.request['i'])).size, 40, 'every append is there once');
      } finally {
        await a.close();
        await b.close();
      }
    },
  );
});
