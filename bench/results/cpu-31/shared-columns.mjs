// The fifteenth stop: CPU per sandbox row inserted into the store's own schema (SQLite), a group of
// G rows per statement, every value bound (multiInsert) against the shared columns bound once
// (multiInsertShared), two stores in one process in turn. From the repository's root after a
// build:  node bench/results/cpu-31/shared-columns.mjs [G=32]
// (2026-12-07: 18.88 -> 16.31 and 15.34 -> 13.53 µs per row at 32; 21.00 -> 19.00 at 14.)
import { mkdtempSync } from 'node:fs';
import { resolve } from 'node:path';
const { StateStore } = await import(resolve('packages/dsec/dist/src/control/state-store.js'));
const { multiInsert, multiInsertShared, sharedInsert } = await import(resolve('packages/dsec/dist/src/control/store/multi-row.js'));
const G = Number(process.argv[2] ?? 32);

const now = new Date().toISOString();
/** What differs from row to row of a batch's group. */
const own = (i) => ({
  id: `sb-e${i % 3}-z${String(i).padStart(20, '0')}`,
  edge: `e${i % 3}`,
  created_at: now,
  last_activity: Date.now(),
  batch_index: i,
});
/** What a batch's group shares. */
const shared = {
  status: 'creating',
  image: 'busybox',
  image_id: `sha256:${'a'.repeat(64)}`,
  resources: JSON.stringify({ memoryMiB: 64, cpu: 0.1, pids: 512 }),
  labels: '{"dsec.batch":"b1"}',
  reason: null,
  layers: JSON.stringify([`sha256:${'b'.repeat(64)}`]),
  ttl_seconds: null,
  idle_timeout_seconds: null,
  on_expiry: 'kill',
  expires_at: null,
  batch_id: 'b1',
  backend: 'container',
  project: 'default',
  cpu: 0.1,
  memory_mib: 64,
  create_owner: 'r1',
  create_lease_until: Date.now() + 60000,
  access_token: null,
};
const columns = [...Object.keys(own(0)), ...Object.keys(shared)];
const insert = sharedInsert('sandboxes', columns, new Set(Object.keys(own(0))));
const group = (from) => Array.from({ length: G }, (_, k) => Object.values({ ...own(from + k), ...shared }));

const open = async () => StateStore.open(`${mkdtempSync('/tmp/wb-')}/state.db`);
const [A, B] = [await open(), await open()];
const ta = [];
const tb = [];
let n = 0;
for (let r = 0; r < 1200; r++) {
  const a = group(n);
  n += G;
  let t = process.cpuUsage();
  await A.db.transaction((tx) => tx.run(multiInsert('sandboxes', columns, G), a.flat()));
  let u = process.cpuUsage(t);
  if (r > 200) ta.push(u.user + u.system);
  const b = multiInsertShared(insert, group(n));
  n += G;
  t = process.cpuUsage();
  await B.db.transaction((tx) => tx.run(b.sql, b.params));
  u = process.cpuUsage(t);
  if (r > 200) tb.push(u.user + u.system);
}
const med = (a) => (a.sort((x, y) => x - y)[a.length >> 1] / G).toFixed(2);
console.log('G', G, 'all bound µs/row', med(ta), 'shared columns once µs/row', med(tb));
await A.close();
await B.close();
