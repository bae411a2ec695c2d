import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { EndedSandboxes } from './ended-sandboxes.js';
import { StateStore } from './state-store.js';
import { testStoreLocation } from '../../test/helpers/postgres.js';
import { sandboxRow } from '../../test/helpers/sandbox-row.js';
import { TrajectoryLog } from './trajectory-log.js';

const HOUR = 3600_000;

const sandbox = (id: string): SandboxInfo => sandboxRow(id);

/** A store holding one sandbox with a two-step trajectory. */
async function storeWithLog(id: string): Promise<{ store: StateStore; log: TrajectoryLog }> {
  const store = await StateStore.open(await testStoreLocation(':memory:'));
  await store.sandboxes.insert(sandbox(id));
  const log = new TrajectoryLog(store);
  await log.append(id, { kind: 'exec', request: { cmd: 'true' }, exitCode: 0 });
  await log.append(id, { kind: 'pause', request: {} });
  return { store, log };
}

describe('EndedSandboxes: the trajectory of a killed sandbox', () => {
  test('is kept for the retention time: the record goes, the log stays readable, then both go', async () => {
    const { store, log } = await storeWithLog('sb-local-aaaaaaaaaaaaa');
    const ended = new EndedSandboxes(store, 24 * HOUR);
    const t0 = Date.UTC(2026, 0, 1);
    await ended.retire(sandbox('sb-local-aaaaaaaaaaaaa'), 'killed', t0);
    assert.equal(await store.sandboxes.get('sb-local-aaaaaaaaaaaaa'), undefined);
    assert.equal((await log.list('sb-local-aaaaaaaaaaaaa')).entries.length, 2);
    assert.deepEqual(await ended.get('sb-local-aaaaaaaaaaaaa', t0 + HOUR), {
      endedAt: new Date(t0).toISOString(),
      reason: 'killed',
      keptUntil: new Date(t0 + 24 * HOUR).toISOString(),
    });
    assert.equal(await ended.expire(t0 + 23 * HOUR), 0);
    assert.equal((await log.list('sb-local-aaaaaaaaaaaaa')).entries.length, 2);
    assert.equal(await ended.get('sb-local-aaaaaaaaaaaaa', t0 + 24 * HOUR), undefined, 'readable past its retention');
    assert.equal(await ended.expire(t0 + 24 * HOUR), 1);
    assert.equal((await log.list('sb-local-aaaaaaaaaaaaa')).entries.length, 0);
    await store.close();
  });

  test('retention 0 deletes the trajectory with the sandbox', async () => {
    const { store, log } = await storeWithLog('sb-local-bbbbbbbbbbbbb');
    const ended = new EndedSandboxes(store, 0);
    await ended.retire(sandbox('sb-local-bbbbbbbbbbbbb'), 'killed');
    assert.equal(await store.sandboxes.get('sb-local-bbbbbbbbbbbbb'), undefined);
    assert.equal((await log.list('sb-local-bbbbbbbbbbbbb')).entries.length, 0);
    assert.equal(await ended.get('sb-local-bbbbbbbbbbbbb'), undefined);
    await store.close();
  });

  test('keeps the labels, project and batch of the sandbox it was (bulk reads and lineage find it by them)', async () => {
    const store = await StateStore.open(await testStoreLocation(':memory:'));
    const s = { ...sandbox('sb-local-ccccccccccccc'), labels: { run: '7', 'dsec.fork-of': 'sb-local-ddddddddddddd' }, project: 'team-a' };
    const spec = { image: 'busybox', env: { TASK: '42' }, labels: s.labels };
    await store.sandboxes.insert(s, { id: 'batch-abcdef', index: 0 }, spec);
    const ended = new EndedSandboxes(store, 24 * HOUR);
    const t0 = Date.UTC(2026, 0, 1);
    await ended.retire(s, 'killed', t0);
    assert.deepEqual(await ended.record(s.id, t0 + HOUR), { project: 'team-a', labels: s.labels });
    const row = await store.db.get<{ batch_id: string; labels: string }>('SELECT batch_id, labels FROM ended_sandboxes WHERE id = ?', [
      s.id,
    ]);
    assert.equal(row?.batch_id, 'batch-abcdef');
    // A second retire (a kill racing another) finds no row: the batch it recorded stays.
    await ended.retire(s, 'killed', t0 + 1);
    assert.equal(
      (await store.db.get<{ batch_id: string }>('SELECT batch_id FROM ended_sandboxes WHERE id = ?', [s.id]))?.batch_id,
      'batch-abcdef',
    );
    // …and so does the create request a replay starts from (not the poorer one rebuilt without the row).
    assert.deepEqual(await ended.replaySource(s.id, t0 + HOUR), { imageId: s.imageId, spec, project: 'team-a' });
    assert.equal(await ended.record(s.id, t0 + 1 + 24 * HOUR), undefined, 'past its retention (from the last retire)');
    await store.close();
  });
});
