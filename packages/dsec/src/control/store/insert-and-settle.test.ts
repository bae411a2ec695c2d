import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { StateStore } from '../state-store.js';
import { CreateWrites } from '../service/create-writes.js';
import { testStoreLocation } from '../../../test/helpers/postgres.js';
import { sandboxRow } from '../../../test/helpers/sandbox-row.js';

/** A new create's row (status creating). */
function info(id: string, labels: Record<string, string> = {}): SandboxInfo {
  return sandboxRow(id, { edge: 'ias', status: 'creating', labels });
}

const LEASE = { owner: 'replica-a', until: Date.now() + 60_000 };

describe('new rows and settles in one write (SQLite, or PostgreSQL with DSEC_TEST_STORE=postgres)', () => {
  let dir: string;
  let store: StateStore;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-ias-'));
    store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('the new rows go in with labels, specs and mounts; the settles apply only where still creating', async () => {
    const old = ['sb-ias-old000', 'sb-ias-old001', 'sb-ias-old002', 'sb-ias-old003'];
    await store.sandboxes.insertMany(
      old.map((id) => ({ info: info(id), spec: { image: 'busybox' } })),
      LEASE,
    );
    await store.sandboxes.setStatus(old[1]!, 'lost', 'edge gone');
    await store.sandboxes.delete(old[2]!);
    const spec = { image: 'busybox', volumes: [{ name: 'iasvol', path: '/data' }] };
    const fresh = ['sb-ias-new000', 'sb-ias-new001'];
    const statuses = await store.sandboxes.insertAndSettle(
      fresh.map((id, i) => ({ info: info(id, { grp: 'ias', nth: String(i) }), spec })),
      LEASE,
      old.map((id) => ({ id, status: 'running' as const })),
    );
    assert.deepEqual(statuses, ['running', 'lost', null, 'running']);
    assert.equal((await store.sandboxes.get(old[0]!))?.status, 'running');
    assert.equal((await store.sandboxes.get(old[1]!))?.status, 'lost');
    const rows = await store.sandboxes.list({ labels: { grp: 'ias' } });
    assert.deepEqual(
      rows.map((r) => [r.id, r.status]),
      fresh.map((id) => [id, 'creating']),
    );
    assert.deepEqual(await store.sandboxes.spec(fresh[1]!), spec);
    assert.deepEqual(await store.volumes.users('iasvol'), fresh);
    assert.equal(await store.sandboxes.createOwner(fresh[0]!), 'replica-a');
  });

  test('all or nothing: a new row whose id is taken fails the write, and no settle is applied', async () => {
    await store.sandboxes.insertMany([{ info: info('sb-ias-aon000'), spec: undefined }], LEASE);
    await assert.rejects(
      store.sandboxes.insertAndSettle(
        [
          { info: info('sb-ias-aon001', { grp: 'aon' }), spec: undefined },
          { info: info('sb-ias-aon000', { grp: 'aon' }), spec: undefined },
        ],
        LEASE,
        [{ id: 'sb-ias-aon000', status: 'running' }],
      ),
    );
    assert.equal((await store.sandboxes.get('sb-ias-aon000'))?.status, 'creating', 'the settle was not applied');
    assert.equal(await store.sandboxes.get('sb-ias-aon001'), undefined, 'the other new row was not written');
  });

  test("a turn's inserts and running marks: when the turn's rows cannot be written, the marks still are", async () => {
    await store.sandboxes.insertMany([{ info: info('sb-ias-cw0000'), spec: undefined }], LEASE);
    const writes = new CreateWrites(store, () => LEASE);
    // One turn: a mark for the row above, a new row, and a new row whose id is taken. The turn's
    // rows are one group, all or none (as they were before marks shared the write).
    const [running, good, bad] = await Promise.allSettled([
      writes.running('sb-ias-cw0000'),
      writes.insert({ info: info('sb-ias-cw0001'), spec: undefined }),
      writes.insert({ info: info('sb-ias-cw0000'), spec: undefined }),
    ]);
    assert.deepEqual(running, { status: 'fulfilled', value: 'running' });
    assert.equal(good.status, 'rejected');
    assert.equal(bad.status, 'rejected');
    assert.equal((await store.sandboxes.get('sb-ias-cw0000'))?.status, 'running');
    assert.equal(await store.sandboxes.get('sb-ias-cw0001'), undefined);
    // A turn of good rows and marks: all written, each mark answered.
    const [r2] = await Promise.all([writes.running('sb-ias-cw0000'), writes.insert({ info: info('sb-ias-cw0002'), spec: undefined })]);
    assert.equal(r2, 'running', 'a row already running answers its status');
    assert.equal((await store.sandboxes.get('sb-ias-cw0002'))?.status, 'creating', 'the insert resolved once its row was written');
    // A mark for a row that is gone answers null.
    assert.equal(await writes.running('sb-ias-nothere'), null);
  });
});
