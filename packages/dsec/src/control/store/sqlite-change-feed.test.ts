import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { hashKey } from '../api-keys.js';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { StateStore } from '../state-store.js';
import { SqliteChangeFeed } from './change-feed.js';
import { SqliteDb } from './sqlite-db.js';

const require = createRequire(import.meta.url);

/**
 * SQLite keeps keys, projects and image owners in memory (read-cache.ts): a change another
 * connection commits (the CLI's tools on a live server's store) is seen by the next read, as it
 * was when every read went to the database.
 */
test("SQLite: another connection's revocation, quota and image owner are seen by the next read", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-sqlite-feed-'));
  const file = join(dir, 'state.db');
  const server = await StateStore.open(file);
  const tool = await StateStore.open(file);
  try {
    await server.keys.insert('key_a', hashKey('secret-a'), 'a');
    await server.projects.insert('p', { maxSandboxes: 5 });
    assert.equal((await server.keys.byHash(hashKey('secret-a')))?.id, 'key_a');
    assert.equal((await server.keys.byHash(hashKey('secret-a')))?.id, 'key_a', 'kept');
    assert.deepEqual((await server.projects.get('p'))?.quota, { maxSandboxes: 5 });
    assert.deepEqual(await server.imageOwners.owners('img', 'sha256:1'), { nameOwner: undefined, idOwners: [] });

    assert.equal(await tool.keys.revoke('key_a'), true);
    assert.equal(await server.keys.byHash(hashKey('secret-a')), undefined, 'the revocation is seen at once');
    await tool.projects.setQuota('p', { maxSandboxes: 7 });
    assert.deepEqual((await server.projects.get('p'))?.quota, { maxSandboxes: 7 });
    await tool.imageOwners.add('sha256:1', 'p');
    await tool.imageOwners.setNameOwner('img', 'p');
    assert.deepEqual(await server.imageOwners.owners('img', 'sha256:1'), { nameOwner: 'p', idOwners: ['p'] });

    // This connection's own changes empty its caches as they are written.
    await server.projects.setQuota('p', { maxSandboxes: 9 });
    assert.deepEqual((await server.projects.get('p'))?.quota, { maxSandboxes: 9 });
    assert.deepEqual((await tool.projects.get('p'))?.quota, { maxSandboxes: 9 }, 'and the other connection sees them');
  } finally {
    await tool.close();
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * A look at data_version is a read transaction; between commits the WAL-index header reads the
 * same, and then none is needed. Another process's commit (no statement of this one to tell) is
 * still heard at the next read after it.
 */
test("SQLite: data_version is asked only when the WAL-index header moved, and another process's commit is heard", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-sqlite-header-'));
  const file = join(dir, 'state.db');
  const db = new SqliteDb(file);
  try {
    await db.exec('CREATE TABLE t (x INTEGER)');
    const feed = new SqliteChangeFeed(db);
    let heard = 0;
    feed.subscribe(() => heard++);
    const nextCallback = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
    await nextCallback();
    feed.catchUp(); // after this connection's own statement: the header moved, so it looks
    const looks = feed.looks;
    for (let i = 0; i < 5; i++) {
      await nextCallback();
      feed.catchUp();
    }
    assert.equal(feed.looks, looks, 'no commit since: no look');
    assert.equal(heard, 0);
    // Another process commits: this process runs no statement that would say so.
    const child = spawnSync(
      process.execPath,
      [
        '-e',
        `const D = require(${JSON.stringify(require.resolve('better-sqlite3'))}); const d = new D(process.argv[1]); d.prepare('INSERT INTO t VALUES (1)').run(); d.close();`,
        file,
      ],
      { encoding: 'utf8' },
    );
    assert.equal(child.status, 0, child.stderr);
    await nextCallback();
    feed.catchUp();
    assert.equal(feed.looks, looks + 1, 'the header moved: it looks');
    assert.equal(heard, 1, "the other process's commit is heard");
  } finally {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
