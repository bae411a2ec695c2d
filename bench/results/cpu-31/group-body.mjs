// The fourteenth stop: CPU per item of a group create's JSON body, 64 busybox items sharing one
// spec, JSON.stringify against groupBody (control/edges/group-body.ts). From the repository's root
// after a build: node bench/results/cpu-31/group-body.mjs
import { resolve } from 'node:path';
const { groupBody } = await import(`${resolve('.')}/packages/dsec/dist/src/control/edges/group-body.js`);
const layers = [`sha256:${'a'.repeat(64)}`];
const config = { env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], cmd: ['sh'], workingDir: '/' };
const limits = { cpu: 0.1, memoryMiB: 64, pids: 512 };
const env = {};
const reqs = Array.from({ length: 64 }, (_, i) => ({
  id: `sb-edge1-z${i.toString(36).padStart(20, '0')}`,
  layers,
  config,
  env,
  limits,
  backend: 'container',
}));
if (groupBody(reqs) !== JSON.stringify({ sandboxes: reqs })) throw new Error('groupBody differs from JSON.stringify');
for (const [name, f] of [
  ['JSON.stringify', (r) => JSON.stringify({ sandboxes: r })],
  ['groupBody', groupBody],
]) {
  for (let w = 0; w < 2000; w++) f(reqs);
  const t = process.cpuUsage();
  for (let w = 0; w < 20000; w++) f(reqs);
  const u = process.cpuUsage(t);
  console.log(name, ((u.user + u.system) / 20000 / 64).toFixed(3), 'µs per item');
}
