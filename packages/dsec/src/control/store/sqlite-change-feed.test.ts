import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { hashKey } from '../api-keys.js';
import { StateStore } from '../state-store.js';
import { SqliteChangeFeed } from './change-feed.js';

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

/** Revokes a key from another process (as `dsec` CLI tools do on a live server's store). */
function revokeElsewhere(file: string, keyId: string): void {
  const storeModule = new URL('../state-store.js', import.meta.url).href;
  const script = `import { StateStore } from ${JSON.stringify(storeModule)};
    const s = await StateStore.open(${JSON.stringify(file)});
    if (!(await s.keys.revoke(${JSON.stringify(keyId)}))) throw new Error('no such key');
    await s.close();`;
  const path = join(dirname(file), 'revoke.mjs');
  writeFileSync(path, script);
  execFileSync(process.execPath, [path], { stdio: 'inherit' });
}

/**
 * With the server's requests numbered (RequestArrivals), a request's reads share one check of
 * data_version made after it arrived; a request that arrives after another process's commit, and
 * work done for no request in a later callback, see the commit.
 */
test("SQLite: a request's reads share one check; a request sent after another process's commit sees it", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-sqlite-feed-'));
  const file = join(dir, 'state.db');
  let count = 0;
  let current: number | undefined;
  const server = await StateStore.open(file, { arrivals: { count: () => count, current: () => current } });
  try {
    await server.keys.insert('key_a', hashKey('secret-a'), 'a');
    await server.keys.insert('key_b', hashKey('secret-b'), 'b');
    current = ++count; // request 1 arrives and reads its key: a check, made after it arrived
    assert.equal((await server.keys.byHash(hashKey('secret-a')))?.id, 'key_a');
    revokeElsewhere(file, 'key_a');
    await nextTurn();
    // Still request 1, a later callback: its check stands (it was sent before the commit, so it
    // may see the key either way); this read is served from memory.
    assert.equal((await server.keys.byHash(hashKey('secret-a')))?.id, 'key_a', 'the check made after request 1 arrived is shared');

    current = ++count; // request 2 arrives after the commit
    assert.equal(await server.keys.byHash(hashKey('secret-a')), undefined, 'a request that arrived after the commit sees it');

    revokeElsewhere(file, 'key_b');
    current = undefined; // work for no request, in a later callback
    await nextTurn();
    assert.equal(await server.keys.byHash(hashKey('secret-b')), undefined, 'background work in a later callback checks again');
  } finally {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A look at data_version that fails (SQLITE_BUSY, an I/O error) is not counted as made: the next read looks again. */
test('SQLite feed: a look that throws does not stand for later reads', async () => {
  let version = 1;
  let failNext = false;
  const db = {
    statements: 0,
    dataVersion: (): number => {
      if (failNext) {
        failNext = false;
        throw new Error('SQLITE_BUSY: database is locked');
      }
      return version;
    },
  };
  let count = 0;
  let current: number | undefined;
  const feed = new SqliteChangeFeed(db, { count: () => count, current: () => current });
  const heard: string[] = [];
  feed.subscribe((t) => heard.push(t));
  current = ++count;
  feed.catchUp(); // request 1 looks: nothing changed
  await nextTurn();
  version = 2; // another process commits
  current = ++count; // request 2 arrives after it
  failNext = true;
  assert.throws(() => feed.catchUp(), /SQLITE_BUSY/);
  await nextTurn();
  feed.catchUp(); // request 2's next read, a later callback
  assert.deepEqual(heard, ['*'], 'the read after the failed look looked again and saw the commit');
});
