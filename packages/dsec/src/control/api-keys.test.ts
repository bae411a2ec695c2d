 
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { authenticate, createApiKey, hashKey } from './api-keys.js';
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
    assert.equal((await store.keyByHash(hashKey(key)))?.id, id);
    const rows = await store.db.all<Record<string, unknown>>('SELECT * FROM api_keys');
    assert.ok(!JSON.stringify(rows).includes(key), 'the key itself is not stored');
  });

  test('two keys are different', async () => {
    assert.notEqual((await createApiKey(store, 'a')).key, (await createApiKey(store, 'b')).key);
  });

  test('authenticate accepts "Bearer <key>" and returns the key id', async () => {
    const { id, key } = await createApiKey(store, 'auth');
    assert.equal(await authenticate(store, `Bearer ${key}`), id);
  });

  test('authenticate accepts the scheme in any case', async () => {
    const { id, key } = await createApiKey(store, 'case');
    assert.equal(await authenticate(store, `bearer ${key}`), id);
  });

  test('authenticate rejects a missing header, another scheme, an unknown key and extra words', async () => {
    const { key } = await createApiKey(store, 'reject');
    assert.equal(await authenticate(store, undefined), undefined);
    assert.equal(await authenticate(store, ''), undefined);
    assert.equal(await authenticate(store, `Basic ${key}`), undefined);
    assert.equal(await authenticate(store, 'Bearer dsec_unknown'), undefined);
    assert.equal(await authenticate(store, `Bearer ${key} extra`), undefined);
    assert.equal(await authenticate(store, key), undefined);
  });
});
