#!/usr/bin/env node
// Idle host memory of N microVMs held at once: each one's cgroup charge, QEMU's RSS and PSS
// (shared pages split between the processes mapping them), and MemAvailable's drop over the N.
// Usage: node scripts/vm-idle-memory.mjs [held=10] [settle s=5] [guest MiB=256]; DSEC_VM_SNAPSHOTS=0 boots each.
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@dsec/sdk';
import { startTestServer } from '../packages/dsec/dist/test/helpers/server.js';

const held = Number(process.argv[2] ?? 10);
const settle = Number(process.argv[3] ?? 5);
const resources = { memoryMiB: Number(process.argv[4] ?? 256), cpu: 1 };
process.env['DSEC_MAX_VMS'] ??= String(held + 2);
const server = await startTestServer();
const mib = (b) => Math.round((b / 1048576) * 10) / 10;
const avail = () => Number(/MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))[1]) * 1024;
const rollup = (pid) => {
  const t = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  const kb = (k) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(t)?.[1] ?? NaN) * 1024;
  return { rss: kb('Rss'), pss: kb('Pss'), privateDirty: kb('Private_Dirty') };
};
try {
  console.log(
    `load average at start: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  // The first create of the image makes its snapshot: not counted among the held.
  const warm = await Sandbox.create({ ...server.conn, backend: 'microvm', resources });
  await warm.kill();
  const before = avail();
  const vms = [];
  for (let i = 0; i < held; i++) {
    const sb = await Sandbox.create({ ...server.conn, backend: 'microvm', resources });
    await sb.commands.run(['true']);
    vms.push(sb);
  }
  await new Promise((r) => setTimeout(r, settle * 1000));
  const rows = [];
  for (const sb of vms) {
    const st = JSON.parse(readFileSync(join(server.dataDir, 'node', 'vms', sb.id, 'state.json'), 'utf8'));
    const usage = Number(readFileSync(`/sys/fs/cgroup/memory/dsec/${sb.id}/memory.usage_in_bytes`, 'utf8'));
    rows.push({ started: st.started, cgroup: usage, ...rollup(st.pid) });
  }
  const avg = (k) => mib(rows.reduce((n, r) => n + r[k], 0) / rows.length);
  console.log(
    JSON.stringify({
      held,
      started: rows[0]?.started,
      perVmMiB: { cgroup: avg('cgroup'), rss: avg('rss'), pss: avg('pss'), privateDirty: avg('privateDirty') },
      memAvailableDropPerVmMiB: mib((before - avail()) / held),
    }),
  );
  console.log(
    `load average at end: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  for (const sb of vms) await sb.kill();
} finally {
  await server.close();
}
