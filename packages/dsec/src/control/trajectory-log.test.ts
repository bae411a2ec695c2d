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
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-trajectory-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a step that ends after its sandbox was deleted leaves no orphan row', () => {
    const store = new StateStore(join(dir, 'orphan.db'));
    const log = new TrajectoryLog(store);
    store.insertSandbox(info('sb-a'));
    log.append('sb-a', { kind: 'exec', request: { cmd: ['true'] } });
    store.deleteSandbox('sb-a');
    // A terminal's exit or a stream's final entry arriving after the kill:
    log.append('sb-a', { kind: 'pty', request: {}, exitCode: 0, replayable: false });
    const rows = store.db.prepare('SELECT count(*) AS n FROM trajectory WHERE sandbox_id = ?').get('sb-a') as { n: number };
    assert.equal(rows.n, 0);
    store.close();
  });

  test('orphan rows an older dsec left are removed when the store opens', () => {
    const file = join(dir, 'old.db');
    const first = new StateStore(file);
    first.db
      .prepare("INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-gone', 1, '2025-01-01T00:00:00Z', 'exec', '{}', 1)")
      .run();
    first.close();
    const second = new StateStore(file);
    const rows = second.db.prepare('SELECT count(*) AS n FROM trajectory').get() as { n: number };
    assert.equal(rows.n, 0);
    second.close();
  });

  test('the dropped count survives a restart of the control plane', () => {
    const file = join(dir, 'dropped.db');
    const store = new StateStore(file);
    store.insertSandbox(info('sb-full'));
    const insert = store.db.prepare("INSERT INTO trajectory (sandbox_id, seq, at, kind, request, replayable) VALUES ('sb-full', ?, '2025-01-01T00:00:00Z', 'exec', '{}', 1)");
    store.db.transaction(() => {
      for (let seq = 1; seq <= MAX_ENTRIES; seq++) insert.run(seq);
    })();
    const log = new TrajectoryLog(store);
    log.append('sb-full', { kind: 'exec', request: {} });
    log.append('sb-full', { kind: 'exec', request: {} });
    assert.equal(log.list('sb-full', 0, 1).dropped, 2);
    store.close();
    const reopened = new StateStore(file);
    assert.equal(new TrajectoryLog(reopened).list('sb-full', 0, 1).dropped, 2);
    reopened.close();
  });
});
