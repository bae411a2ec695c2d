// WAL frames (pages written back) per commit of a single-create turn: 14 new rows and 14 settles,
// on a store of ~10,000 rows, the way CreateWrites writes a turn (SandboxRecords.insertAndSettle).
// From the repository's root, after a build: node bench/results/cpu-31/wal-frames.mjs
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { StateStore } from '../../../packages/dsec/dist/src/control/state-store.js';
import { sandboxRow } from '../../../packages/dsec/dist/test/helpers/sandbox-row.js';
import { newSandboxId } from '../../../packages/dsec/dist/src/control/sandbox-ids.js';
import { rmSync, mkdtempSync } from 'node:fs';
const dir = mkdtempSync(join(tmpdir(), 'dsec-wal-frames-'));
const file = dir + '/state.db';
const store = await StateStore.open(file);
const spec = { image: 'busybox', resources: { memoryMiB: 64, cpu: 0.1 } };
const lease = { owner: 'r', until: Date.now() + 60000 };
let pending = [];
const mk = () => {
  const info = sandboxRow(newSandboxId('bench1s1'), { edge: 'bench1s1', status: 'creating', labels: {} });
  return { info, spec };
};
// ~10,000 rows first, written as turns are
for (let i = 0; i < 700; i++) {
  const rows = Array.from({ length: 14 }, mk);
  await store.sandboxes.insertAndSettle(
    rows,
    lease,
    pending.map((id) => ({ id, status: 'running' })),
  );
  pending = rows.map((r) => r.info.id);
}
let grew = 0,
  commits = 0,
  t = 0;
for (let i = 0; i < 200; i++) {
  const rows = Array.from({ length: 14 }, mk);
  const c0 = process.cpuUsage();
  await store.sandboxes.insertAndSettle(
    rows,
    lease,
    pending.map((id) => ({ id, status: 'running' })),
  );
  const c = process.cpuUsage(c0);
  t += c.user + c.system;
  const r = await store.db.all('PRAGMA wal_checkpoint(PASSIVE)');
  if (i > 0) {
    grew += r[0].log;
    commits++;
  }
  pending = rows.map((r) => r.info.id);
}
console.log('frames per commit', (grew / commits).toFixed(1), 'over', commits, 'commits; cpu per turn', (t / 200).toFixed(0), 'µs');
await store.close();
rmSync(dir, { recursive: true, force: true });
