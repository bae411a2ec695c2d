import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import Database from 'better-sqlite3';
import { SqliteCheckpointer } from './sqlite-checkpointer.js';

test('the checkpoint thread copies a growing WAL back while the writer never checkpoints, and nothing is lost', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-ckpt-'));
  const file = join(dir, 'state.db');
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('wal_autocheckpoint = 0'); // only the thread checkpoints here
  db.exec('CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)');
  const ckpt = SqliteCheckpointer.start(file, { everyMs: 20, minWalBytes: 256 * 1024 });
  try {
    const insert = db.prepare('INSERT INTO t (body) VALUES (?)');
    const body = 'x'.repeat(1000);
    let largestWal = 0;
    // 40 commits of ~1 MiB each: without checkpoints the WAL would hold all ~40 MiB (it does, with the thread off).
    for (let round = 0; round < 40; round++) {
      db.transaction(() => {
        for (let i = 0; i < 1000; i++) insert.run(body);
      })();
      largestWal = Math.max(largestWal, statSync(`${file}-wal`).size);
      await new Promise((r) => setTimeout(r, 30));
    }
    const runs = await ckpt.checkpoints();
    assert.ok(runs >= 2, `the thread checkpointed (${runs} times)`);
    assert.ok(largestWal < 20 * 1024 * 1024, `the WAL was started over rather than growing to ~40 MiB (largest ${largestWal} bytes)`);
    assert.equal((db.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n, 40_000);
  } finally {
    await ckpt.close();
    db.close();
  }
  const again = new Database(file);
  assert.equal((again.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n, 40_000, 'every row is there after reopening');
  again.close();
  rmSync(dir, { recursive: true, force: true });
});

test('close() of a thread that could not open its database returns', async () => {
  const ckpt = SqliteCheckpointer.start('/nonexistent-dir/state.db', { everyMs: 10 });
  await new Promise((r) => setTimeout(r, 200));
  await ckpt.close();
});
