// The fifteenth stop: CPU per sandbox row inserted into the store's own schema (SQLite), a group of
// G rows per statement, every value bound (multiInsert) against the shared columns bound once
// (multiInsertShared's statement), two stores in one process in turn. From the repository's root
// after a build:  node bench/results/cpu-31/shared-columns.mjs [G=32]
// (2026-12-07: 18.88 -> 16.31 and 15.34 -> 13.53 µs per row at 32; 21.00 -> 19.00 at 14).
import { resolve } from 'node:path';
import { mkdtempSync } from 'node:fs';
const { StateStore } = await import(resolve('packages/dsec/dist/src/control/state-store.js'));
const G = Number(process.argv[2] ?? 32);
const COLS = ['id','edge','status','image','image_id','resources','labels','created_at','reason','layers','ttl_seconds','idle_timeout_seconds','on_expiry','expires_at','last_activity','batch_id','batch_index','backend','project','cpu','memory_mib','create_owner','create_lease_until','access_token'];
const VAR = ['id','edge','created_at','last_activity','batch_index'];
const mkStore = async () => StateStore.open(mkdtempSync('/tmp/wb-') + '/state.db');
const A = await mkStore(), B = await mkStore();
const now = new Date().toISOString();
const res = JSON.stringify({ memoryMiB: 64, cpu: 0.1, pids: 512 }), lay = JSON.stringify(['sha256:' + 'b'.repeat(64)]);
let n = 0;
const row = (i) => ({ id: `sb-e${i % 3}-z${String(i).padStart(20, '0')}`, edge: 'e' + (i % 3), created_at: now, last_activity: Date.now(), batch_index: i });
const constVals = { status: 'creating', image: 'busybox', image_id: 'sha256:' + 'a'.repeat(64), resources: res, labels: '{"dsec.batch":"b1"}', reason: null, layers: lay, ttl_seconds: null, idle_timeout_seconds: null, on_expiry: 'kill', expires_at: null, batch_id: 'b1', backend: 'container', project: 'default', cpu: 0.1, memory_mib: 64, create_owner: 'r1', create_lease_until: Date.now() + 60000, access_token: null };
const stmtA = `INSERT INTO sandboxes (${COLS.join(', ')}) VALUES ${Array.from({ length: G }, () => `(${COLS.map(() => '?').join(', ')})`).join(', ')}`;
const CONST = COLS.filter((c) => !VAR.includes(c));
const stmtB = `INSERT INTO sandboxes (${[...VAR, ...CONST].join(', ')}) SELECT v.*, ${CONST.map(() => '?').join(', ')} FROM (VALUES ${Array.from({ length: G }, () => `(${VAR.map(() => '?').join(', ')})`).join(', ')}) v`;
const ta = [], tb = [];
for (let r = 0; r < 1200; r++) {
  const rows = Array.from({ length: G }, () => row(n++));
  const pa = []; for (const x of rows) for (const c of COLS) pa.push(c in x ? x[c] : constVals[c]);
  let t = process.cpuUsage();
  await A.db.transaction((tx) => tx.run(stmtA, pa));
  let u = process.cpuUsage(t); if (r > 200) ta.push(u.user + u.system);
  const rows2 = Array.from({ length: G }, () => row(n++));
  const pb = []; for (const c of CONST) pb.push(constVals[c]); for (const x of rows2) for (const c of VAR) pb.push(x[c]);
  t = process.cpuUsage();
  await B.db.transaction((tx) => tx.run(stmtB, pb));
  u = process.cpuUsage(t); if (r > 200) tb.push(u.user + u.system);
}
const med = (a) => (a.sort((x, y) => x - y)[a.length >> 1] / G).toFixed(2);
console.log('G', G, 'all bound µs/row', med(ta), 'constants once µs/row', med(tb));
const chk = await B.db.all("SELECT status, project, cpu FROM sandboxes LIMIT 1"); console.log(chk);
