import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { StateStore } from './state-store.js';
import { MAX_ENTRIES, TrajectoryLog } from './trajectory-log.js';

function info(id: string): SandboxInfo {
  const at = '2025-01-01T00:00:00.000Z';
  return {
    id, edge: 'local', backend: 'container', status: 'running', image: 'busybox', imageId: `sha256:${'0'.repeat(64)}`,
    resources: { cpu: 1, memoryMiB: 64, pids: 64 }, labels: {}, layers: [], onExpiry: 'stop', lastActivityAt: at, createdAt: at,
  } as unknown as SandboxInfo;
}

describe('TrajectoryLog', () => {
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-trajectory-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a step that ends after its sandbox was deleted leaves no orphan row', async () => {
    const store = await StateStore.open(join(dir, 'orphan.db'));
    const log = new TrajectoryLog(store);
    await store.insertSandbox(info('sb-a'));
    await log.append('sb-a', { kind: 'exec', request: { cmd: ['true'] } });
    await store.deleteSandbox('sb-a');
    // A terminal's exit or a stream's final entry arriving after the kill:
    await log.append('sb-a', { kind: 'pty', request: {}, exitCode: 0, replayable: false });
    const rows = (await store.db.get<{ n: number }>('SELECT count(*) AS n FROM trajectory WHERE sandbox_id = ?', ['sb-a']))!;
    assert.equal(rows.n, 0);
    await store.close();
  });

  test('orphan rows an older dsec left are removed when the store opens', async () => {
    const file = join(dir, 'old.db');
    const first = await StateStore.open(file);
    await first.db.run("INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-gone', 1, '2025-01-01T00:00:00Z', 'exec', '{}', 1)");
    await first.close();
    const second = await StateStore.open(file);
    const rows = (await second.db.get<{ n: number }>('SELECT count(*) AS n FROM trajectory'))!;
    assert.equal(rows.n, 0);
    await second.close();
  });

  test('the dropped count survives a restart of the control plane', async () => {
    const file = join(dir, 'dropped.db');
    const store = await StateStore.open(file);
    await store.insertSandbox(info('sb-full'));
    await store.db.transaction(async (tx) => {
      for (let seq = 1; seq <= MAX_ENTRIES; seq++) {
        await tx.run("INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-full', ?, '2025-01-01T00:00:00Z', 'exec', '{}', 1)", [seq]);
      }
    });
    const log = new TrajectoryLog(store);
    await log.append('sb-full', { kind: 'exec', request: {} });
    await log.append('sb-full', { kind: 'exec', request: {} });
    assert.equal((await log.list('sb-full', 0, 1)).dropped, 2);
    await store.close();
    const reopened = await StateStore.open(file);
    assert.equal((await new TrajectoryLog(reopened).list('sb-full', 0, 1)).dropped, 2);
    await reopened.close();
  });
});
