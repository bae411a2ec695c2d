// The fourteenth stop: CPU per batch event recorded (LiveBatch.record), 64,000 events a round as a
// batch of 32,000 makes them. Run from the repository's root after a build:
//   node bench/results/cpu-31/record-event.mjs [checkout=.]
// and give another checkout's root to compare (the session's start: 4.4-5.4 µs, the final code 1.5-2.8).
import { resolve } from 'node:path';
const root = resolve(process.argv[2] ?? '.');
const { LiveBatch } = await import(`${root}/packages/dsec/dist/src/control/service/live-batch.js`);
const rounds = [];
for (let round = 0; round < 8; round++) {
  const b = new LiveBatch('batch-x', 32000, { image: 'busybox' }, new Date().toISOString(), 'default');
  const t = process.cpuUsage();
  for (let i = 0; i < 32000; i++) {
    b.record({ type: 'placed', index: i, edge: `edge-${i % 3}`, sandboxId: `sb-abc-${i}` });
    b.record({ type: 'running', index: i, sandboxId: `sb-abc-${i}`, edge: `edge-${i % 3}` });
  }
  b.takeUnflushed();
  const u = process.cpuUsage(t);
  rounds.push((u.user + u.system) / 64000);
}
console.log(root, 'µs per event, rounds:', rounds.map((x) => x.toFixed(2)).join(' '));
