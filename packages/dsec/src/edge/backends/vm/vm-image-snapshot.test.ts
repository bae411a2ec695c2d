import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import pino from 'pino';
import { slotOf, VmImageSnapshots } from './vm-image-snapshot.js';

const root = mkdtempSync(join(tmpdir(), 'vm-image-snapshot-'));
after(() => rmSync(root, { recursive: true, force: true }));

function snapshots(name: string): VmImageSnapshots {
  const dir = join(root, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'vmlinuz'), 'kernel');
  writeFileSync(join(dir, 'initramfs.cpio'), 'agent');
  const guest = { kernel: join(dir, 'vmlinuz'), initramfs: join(dir, 'initramfs.cpio'), kernelVersion: 'test' };
  return new VmImageSnapshots({ nodeDir: dir, guest, log: pino({ level: 'silent' }) });
}

const spec = {
  backend: 'microvm' as const,
  layers: [`sha256:${'a'.repeat(64)}` as const],
  limits: { cpu: 1, memoryMiB: 128, pids: 64 },
  diskMiB: 64,
  accel: 'tcg' as const,
};

test('a snapshot is used while its fingerprint holds; once the kernel (or agent, or QEMU) changes it is removed, not used', async () => {
  const s = snapshots('stale');
  assert.equal(await s.find(spec), undefined, 'none yet');
  const dir = join(s.dir, slotOf(spec));
  mkdirSync(dir);
  writeFileSync(join(dir, 'meta.json'), JSON.stringify({ fingerprint: await s.fingerprint('tcg'), spec }));
  assert.equal((await s.find(spec))?.dir, dir, 'a fresh snapshot is found');
  assert.equal(await s.find({ ...spec, limits: { ...spec.limits, memoryMiB: 256 } }), undefined, 'another guest shape has its own slot');
  assert.equal(await s.find({ ...spec, accel: 'kvm' }), undefined, 'another accelerator: stale');
  assert.equal(existsSync(dir), false, 'the stale snapshot is removed');
  mkdirSync(dir);
  writeFileSync(join(dir, 'meta.json'), JSON.stringify({ fingerprint: await s.fingerprint('tcg'), spec }));
  writeFileSync(join(root, 'stale', 'initramfs.cpio'), 'another agent');
  assert.equal(await s.find(spec), undefined, 'a new initramfs (agent) makes it stale');
  assert.equal(existsSync(dir), false);
});

test("the edge's start removes what an interrupted build left, and kills only that build's QEMU", async () => {
  const s = snapshots('cleanup');
  const build = join(s.dir, `${'1'.repeat(12)}.build-abcd`);
  mkdirSync(build);
  // A pid that is no QEMU of this build (a recycled pid): it must live on.
  const other = spawn('sleep', ['30'], { stdio: 'ignore' });
  writeFileSync(join(build, 'pid'), String(other.pid));
  const slot = join(s.dir, '2'.repeat(20));
  mkdirSync(slot);
  await s.cleanup();
  assert.equal(existsSync(build), false, 'the build directory is gone');
  assert.equal(existsSync(slot), true, 'a finished snapshot stays');
  assert.equal(other.exitCode, null, 'a process that is not the build QEMU is not killed');
  other.kill('SIGKILL');
});
