#!/usr/bin/env node
// Evidence for vm-image-snapshot.ts's choice of no free page reporting: boots a guest whose RAM is
// a private (share=off) mapping of a fully allocated file of zeros, with virtio-balloon free page
// reporting on or off, and prints the file's allocated size as the guest runs. On QEMU 7.2 with
// reporting on, the file loses blocks (ram_block_discard_range punches holes in it), so a
// snapshot's RAM file that siblings map would be changed under them.
// Usage: node scripts/vm-fpr-punch-check.mjs on|off LAYER.erofs   (root; built dist and guest)
import { mkdtempSync, rmSync } from 'node:fs';
import { spawn, execFileSync } from 'node:child_process';
import { qemuArgs, VmPaths } from '../packages/dsec/dist/src/edge/backends/vm/qemu-launch.js';
import { guestAssets } from '../packages/dsec/dist/src/edge/backends/vm/guest-assets.js';
import { makeDisk } from '../packages/dsec/dist/src/edge/backends/vm/vm-boot.js';
const dir = mkdtempSync('/var/tmp/dsec-fpr-');
const layer = process.argv[3];
const paths = new VmPaths(dir);
await makeDisk(paths.disk, 64);
execFileSync('sh', ['-c', `head -c ${256 << 20} /dev/zero > ${dir}/ram`]); // zeros, every block allocated
const du = () => execFileSync('du', ['-k', `${dir}/ram`], { encoding: 'utf8' }).split('\t')[0];
console.log('ram file allocated KiB before:', du());
const fpr = process.argv[2] ?? 'on';
const args = qemuArgs({
  machine: 'microvm',
  accel: 'tcg',
  guest: guestAssets(),
  paths,
  layers: [layer],
  vcpus: 1,
  memoryMiB: 256,
  cgroupProcs: [],
  memory: { file: `${dir}/ram` },
}).map((a) => a.replace('free-page-reporting=off', `free-page-reporting=${fpr}`));
console.log(args.filter((a) => /balloon|memory-backend/.test(a)).join(' | '));
const q = spawn('unshare', ['--net', '--', 'qemu-system-x86_64', ...args], { stdio: ['ignore', 'inherit', 'inherit'] });
for (const s of [10, 20, 30]) {
  await new Promise((r) => setTimeout(r, 10000));
  console.log(`after ${s} s: allocated KiB`, du());
}
q.kill('SIGKILL');
await new Promise((r) => q.once('exit', r));
rmSync(dir, { recursive: true, force: true });
