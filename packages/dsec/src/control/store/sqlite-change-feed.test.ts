import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { hashKey } from '../api-keys.js';
import { StateStore } from '../state-store.js';

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
