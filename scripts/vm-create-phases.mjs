#!/usr/bin/env node
// Where a microVM create's time goes: N creates (cold boot, or from the image's snapshot when the
// edge has one) and a fork of the first, each followed by its first command, with the steps each
// create's record noted (state.json `createPhases`, edge/backends/vm/phase-clock.ts).
// Usage: node scripts/vm-create-phases.mjs [creates=3]   (built dist; root; QEMU and the guest built)
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from '@dsec/sdk';
import { startTestServer } from '../packages/dsec/dist/test/helpers/server.js';

const n = Number(process.argv[2] ?? 3);
const server = await startTestServer();
const phases = (id) => JSON.parse(readFileSync(join(server.dataDir, 'node', 'vms', id, 'state.json'), 'utf8')).createPhases;
const spec = { ...server.conn, backend: 'microvm', resources: { memoryMiB: 256, cpu: 1, diskMiB: 2048 } };
try {
  console.log(
    `load average at start: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
  const made = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const sb = await Sandbox.create(spec);
    const t1 = performance.now();
    await sb.commands.run(['true']);
    const t2 = performance.now();
    made.push(sb);
    console.log(
      JSON.stringify({ what: 'create', createMs: Math.round(t1 - t0), toFirstCommandMs: Math.round(t2 - t0), phases: phases(sb.id) }),
    );
  }
  const t0 = performance.now();
  const { sandboxes, result } = await made[0].fork(1);
  if (!sandboxes.length) throw new Error(`fork failed: ${JSON.stringify(result.failures)}`);
  const t1 = performance.now();
  await sandboxes[0].commands.run(['true']);
  const t2 = performance.now();
  console.log(
    JSON.stringify({ what: 'fork', forkMs: Math.round(t1 - t0), toFirstCommandMs: Math.round(t2 - t0), phases: phases(sandboxes[0].id) }),
  );
  console.log(
    `load average at end: ${loadavg()
      .map((l) => l.toFixed(2))
      .join(' ')}`,
  );
} finally {
  await server.close();
}
