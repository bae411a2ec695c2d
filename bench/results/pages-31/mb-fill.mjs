// Fills a SQLite state store with N sandboxes like the bench's hold (batches of 32,000, one label each).
import { StateStore } from '/work/wt-pages/packages/dsec/dist/src/control/state-store.js';
const n = Number(process.argv[2] ?? 400000);
const store = await StateStore.open('/var/tmp/pages-mb/state.db');
const t0 = Date.now();
const digest = 'sha256:' + 'a'.repeat(64);
let made = 0;
for (let b = 0; made < n; b++) {
  const size = Math.min(32000, n - made);
  for (let i = 0; i < size; i += 2000) {
    const rows = [];
    for (let j = i; j < Math.min(size, i + 2000); j++) {
      const k = made + j;
      const edge = `benchedge${String(k % 100).padStart(3, '0')}`;
      rows.push({
        info: {
          id: `sb-${edge}-${k.toString(36).padStart(12, '0')}`,
          edge,
          project: 'default',
          backend: 'container',
          status: 'running',
          image: 'busybox',
          imageId: 'sha256:' + 'b'.repeat(64),
          resources: { cpu: 0.1, memoryMiB: 64, pids: 512 },
          labels: { 'hold-batch': String(b) },
          layers: [digest],
          createdAt: new Date(t0 + k).toISOString(),
          onExpiry: 'stop',
          lastActivityAt: new Date(t0 + k).toISOString(),
        },
        spec: { image: 'busybox', resources: { memoryMiB: 64, cpu: 0.1 }, labels: { 'hold-batch': String(b) } },
      });
    }
    await store.sandboxes.insertMany(rows);
  }
  made += size;
  console.log('filled', made);
}
await store.close();
