import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { authenticate, createApiKey, hashKey } from './api-keys.js';
import { bearerToken } from '../http/credentials.js';
import { StateStore } from './state-store.js';
import { testStoreLocation } from '../../test/helpers/postgres.js';

describe('API keys', () => {
  let dir: string;
  let store: StateStore;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-keys-'));
    store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('hashKey is the hex sha256 of the key', async () => {
    assert.equal(hashKey('abc'), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
  });

  test('createApiKey returns a dsec_ key and stores only its hash', async () => {
    const { id, key } = await createApiKey(store, 'test');
    assert.match(id, /^key_[0-9a-f]{12}$/);
    assert.match(key, /^dsec_[A-Za-z0-9_-]{43}$/);
    assert.equal((await store.keys.byHash(hashKey(key)))?.id, id);
    const rows = await store.db.all<Record<string, unknown>>('SELECT * FROM api_keys');
    assert.ok(!JSON.stringify(rows).includes(key), 'the key itself is not stored');
  });

  test('two keys are different', async () => {
    assert.notEqual((await createApiKey(store, 'a')).key, (await createApiKey(store, 'b')).key);
  });

  test('authenticate accepts "Bearer <key>" and returns the caller: key, project, admin', async () => {
    const { id, key } = await createApiKey(store, 'auth');
    assert.deepEqual(await authenticate(store, bearerToken(`Bearer ${key}`)), { keyId: id, project: 'default', admin: false });
  });

  test('a key carries the project and admin flag it was made with', async () => {
    await store.projects.insert('team-a', {});
    const { id, key } = await createApiKey(store, 'scoped', { project: 'team-a', admin: true });
    assert.deepEqual(await authenticate(store, bearerToken(`Bearer ${key}`)), { keyId: id, project: 'team-a', admin: true });
  });

  test('a revoked key no longer authenticates; revoking an unknown key says so', async () => {
    const { id, key } = await createApiKey(store, 'revoke');
    assert.equal(await store.keys.revoke(id), true);
    assert.equal(await authenticate(store, bearerToken(`Bearer ${key}`)), undefined);
    assert.ok((await store.keys.list()).find((k) => k.id === id)?.revokedAt);
    assert.equal(await store.keys.revoke('key_000000000000'), false);
  });

  test('authenticate accepts the scheme in any case', async () => {
    const { id, key } = await createApiKey(store, 'case');
    assert.equal((await authenticate(store, bearerToken(`bearer ${key}`)))?.keyId, id);
  });

  test('authenticate rejects a missing header, another scheme, an unknown key and extra words', async () => {
    const { key } = await createApiKey(store, 'reject');
    assert.equal(await authenticate(store, bearerToken(undefined)), undefined);
    assert.equal(await authenticate(store, bearerToken('')), undefined);
    assert.equal(await authenticate(store, bearerToken(`Basic ${key}`)), undefined);
    assert.equal(await authenticate(store, bearerToken('Bearer dsec_unknown')), undefined);
    assert.equal(await authenticate(store, bearerToken(`Bearer ${key} extra`)), undefined);
    assert.equal(await authenticate(store, bearerToken(key)), undefined);
  });
});

describe('projects migration', () => {
  test('keys from before projects land in default; the bootstrap key (client.json) becomes an admin key', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-keys-mig-'));
    try {
      // A state db as dsec wrote it before projects: api_keys without project, admin or revoked_at.
      const Database = (await import('better-sqlite3')).default;
      const old = new Database(join(dir, 'state.db'));
      old.exec('CREATE TABLE api_keys (id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, name TEXT NOT NULL, created_at TEXT NOT NULL)');
      old
        .prepare('INSERT INTO api_keys VALUES (?, ?, ?, ?)')
        .run('key_000000000001', hashKey('boot'), 'client.json', new Date().toISOString());
      old.prepare('INSERT INTO api_keys VALUES (?, ?, ?, ?)').run('key_000000000002', hashKey('other'), 'e2b', new Date().toISOString());
      old.close();
      const migrated = await StateStore.open(join(dir, 'state.db'));
      try {
        assert.deepEqual(await authenticate(migrated, bearerToken('Bearer boot')), {
          keyId: 'key_000000000001',
          project: 'default',
          admin: true,
        });
        assert.deepEqual(await authenticate(migrated, bearerToken('Bearer other')), {
          keyId: 'key_000000000002',
          project: 'default',
          admin: false,
        });
        assert.deepEqual(
          (await migrated.projects.list()).map((p) => p.name),
          ['default'],
        );
      } finally {
        await migrated.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
