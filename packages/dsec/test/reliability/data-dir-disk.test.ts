/**
 * A data dir on an overlay root (dsec in a container, fresh-machine) gets a disk, not memory:
 * doctor makes a sparse ext4 image beside it and loop-mounts it there (host/data-dir-image.ts).
 * On the tmpfs doctor mounted before, everything a sandbox wrote to its upper was RAM charged to
 * its memory cgroup: `red team: snapshot limits` was OOM-killed (exit 137) writing 1.5 GB into a
 * sandbox's /tmp. Here a sandbox limited to 64 MiB writes 200 MiB into its upper; doctor run
 * again (and again after an unmount, as after a reboot) keeps the image and its data; and
 * unmounting leaves no loop device behind.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { fixDataDirFs } from '../../src/host/data-dir-fs.js';
import { dataDirImagePath, IMAGE_MAX_BYTES, IMAGE_MIN_BYTES, imageSizeBytes } from '../../src/host/data-dir-image.js';
import { readMounts } from '../../src/host/mounts.js';
import { MNT_DETACH, mount, umount } from '../../src/host/syscalls.js';
import { dataDirLeaks, integrationSkipReason, makeDataDir, mountsBelow, newEdgeId, startDsec } from '../helpers/server.js';

/** Loop devices whose backing file is under `prefix`: name → file. */
function loopsBackedUnder(prefix: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const d of readdirSync('/sys/class/block').filter((n) => /^loop\d+$/.test(n))) {
    try {
      const file = readFileSync(`/sys/class/block/${d}/loop/backing_file`, 'utf8').trim();
      if (file.startsWith(prefix)) out.set(`/dev/${d}`, file);
    } catch {
      // not attached
    }
  }
  return out;
}

/**
 * Other mount namespaces (of a process, or held open as an fd) with a mount of `device`. A mount
 * namespace made while the image was mounted copied that mount: an edge's dsec-spawn keeps such a
 * copy as its template for the edge's life (native/spawn-helper.c), so on a shared host another
 * run's edge started meanwhile holds the ext4, and its loop device, until it ends.
 */
function namespacesHolding(device: string): string[] {
  const majMin = readFileSync(`/sys/class/block/${device.replace('/dev/', '')}/dev`, 'utf8').trim();
  const ours = readlinkSync('/proc/self/ns/mnt');
  const seen = new Map<string, string>();
  for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    const links = [`/proc/${pid}/ns/mnt`];
    try {
      for (const fd of readdirSync(`/proc/${pid}/fd`)) links.push(`/proc/${pid}/fd/${fd}`);
    } catch {
      // exited, or a kernel thread
    }
    for (const link of links) {
      try {
        const ns = readlinkSync(link);
        if (ns.startsWith('mnt:') && ns !== ours && !seen.has(ns)) seen.set(ns, link);
      } catch {
        // gone meanwhile
      }
    }
  }
  const holders: string[] = [];
  for (const [ns, link] of seen) {
    const r = spawnSync('nsenter', [`--mount=${link}`, 'cat', '/proc/self/mountinfo'], { encoding: 'utf8' });
    if (r.stdout.split('\n').some((l) => l.split(' ')[2] === majMin)) holders.push(`${ns} (${link})`);
  }
  return holders;
}

const skip =
  integrationSkipReason() ??
  (existsSync('/dev/loop-control') ? undefined : 'no /dev/loop-control: doctor falls back to a tmpfs here (doctor-fixes.test.ts)');

describe('doctor: a data dir on an overlay root is a loop-mounted ext4 image', { skip, timeout: 180_000 }, () => {
  let base = '';
  let merged = '';
  let dataDir = '';
  let image = '';
  const own = () => readMounts().findLast((m) => m.mountPoint === dataDir);

  before(() => {
    // The overlay's dirs on a disk: a test data dir is one (inside the test process's own
    // loop-mounted image when /var/tmp is an overlay itself), under the leak check's prefix.
    base = makeDataDir();
    for (const d of ['lower', 'upper', 'work', 'merged']) mkdirSync(join(base, d));
    merged = join(base, 'merged');
    mount('overlay', merged, 'overlay', 0, `lowerdir=${join(base, 'lower')},upperdir=${join(base, 'upper')},workdir=${join(base, 'work')}`);
    dataDir = join(merged, 'data');
    image = dataDirImagePath(dataDir);
  });
  after(() => {
    while (dataDir && own()) umount(dataDir);
    // Lazily: another namespace's copy of the image's mount keeps its loop device, which keeps
    // the image (a file on this overlay) open; all of it goes when that namespace does.
    if (merged && readMounts().some((m) => m.mountPoint === merged)) umount(merged, MNT_DETACH);
    if (base && mountsBelow(base).length === 0) rmSync(base, { recursive: true, force: true });
  });

  test('the image is sized from the free disk: 3/4 of it, at least 2 GiB, at most 1 TiB', () => {
    assert.equal(imageSizeBytes(IMAGE_MIN_BYTES), undefined, 'too little free disk makes no image');
    assert.equal(imageSizeBytes(8 * 2 ** 30), 6 * 2 ** 30);
    assert.equal(imageSizeBytes(100 * 2 ** 40), IMAGE_MAX_BYTES);
  });

  test('doctor mounts a sparse ext4 image there, through a loop device, nosuid but not nodev', () => {
    const check = fixDataDirFs(dataDir);
    assert.equal(check.ok, true, check.detail);
    assert.match(check.fixed ?? '', /made the sparse ext4 image/);
    const m = own();
    assert.equal(m?.fsType, 'ext4', `the data dir is on ${m?.fsType ?? 'overlayfs still'}`);
    assert.match(m.source, /^\/dev\/loop\d+$/);
    assert.deepEqual([...loopsBackedUnder(base)], [[m.source, image]]);
    // Autoclear: the device goes when its last user (the mount) does, so no path leaks one.
    assert.equal(readFileSync(`/sys/class/block/${m.source.replace('/dev/', '')}/loop/autoclear`, 'utf8').trim(), '1');
    assert.ok(m.options.includes('nosuid') && !m.options.includes('nodev'), `mounted with ${m.options.join(',')}`);
    const st = statSync(image);
    assert.ok(st.size >= IMAGE_MIN_BYTES, `image of ${st.size} bytes`);
    assert.ok(st.blocks * 512 < st.size / 10, `the image is not sparse: ${st.blocks * 512} of ${st.size} bytes on disk`);
    writeFileSync(join(dataDir, 'marker'), 'kept');
  });

  test('a sandbox limited to 64 MiB writes 200 MiB into its upper there without being OOM-killed', async () => {
    assert.equal(own()?.fsType, 'ext4');
    const edgeId = newEdgeId();
    const dsec = await startDsec(dataDir, { edgeId });
    try {
      const usedBefore = statSync(image).blocks * 512;
      const sb = await Sandbox.create({ url: dsec.url, apiKey: dsec.apiKey, resources: { memoryMiB: 64 } });
      const r = await sb.commands.run('dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1 && sync && du -m /tmp/big', { timeoutMs: 120_000 });
      assert.equal(r.exitCode, 0, `exit ${r.exitCode}: ${r.stdout}${r.stderr}`);
      assert.match(r.stdout, /^20[0-9]\s+\/tmp\/big$/m);
      const grew = statSync(image).blocks * 512 - usedBefore;
      assert.ok(grew >= 200 * 2 ** 20, `the image grew by ${grew} bytes: the write did not land on it`);
      await sb.kill();
    } finally {
      await dsec.close({ killAll: true });
    }
    assert.deepEqual(await dataDirLeaks(dataDir, edgeId), []);
  });

  test('doctor again, and after an unmount (a reboot, a new container), keeps the same image and its data', (t) => {
    const device = own()?.source ?? '';
    const inode = statSync(image).ino;
    const again = fixDataDirFs(dataDir);
    assert.equal(again.ok, true, again.detail);
    assert.equal(again.fixed, undefined, 'a second run changes nothing');
    assert.match(again.detail, new RegExp(`is on ext4 \\(${image} on ${device}\\)`));
    assert.equal(readMounts().filter((m) => m.mountPoint === dataDir).length, 1, 'mounted once');

    umount(dataDir);
    const holders = loopsBackedUnder(base).size ? namespacesHolding(device) : [];
    if (holders.length) t.diagnostic(`${device} stays: mount namespaces made meanwhile hold its ext4: ${holders.join(', ')}`);
    else assert.deepEqual([...loopsBackedUnder(base)], [], 'the loop device goes with the unmount (autoclear)');
    const remount = fixDataDirFs(dataDir);
    assert.equal(remount.ok, true, remount.detail);
    assert.match(remount.fixed ?? '', /mounted its ext4 image .* kept from an earlier run/);
    assert.equal(statSync(image).ino, inode, 'the same image file');
    assert.equal(readFileSync(join(dataDir, 'marker'), 'utf8'), 'kept', 'formatted again: the data is gone');
    assert.equal(own()?.fsType, 'ext4');
    // A device still holding the image is used again: two ext4s over one file would corrupt it.
    if (holders.length) assert.equal(own()?.source, device);
  });

  test('an image that fails its check is left alone, with nothing mounted over the data dir', (t) => {
    const device = own()?.source ?? '';
    umount(dataDir);
    const holders = loopsBackedUnder(base).size ? namespacesHolding(device) : [];
    if (holders.length)
      return t.skip(`${device} is still mounted in other mount namespaces (${holders.join(', ')}): e2fsck is not run on it`);
    // Zero the primary superblock (1 KiB in): e2fsck -p cannot repair that unattended.
    const r = spawnSync('dd', ['if=/dev/zero', `of=${image}`, 'bs=1024', 'seek=1', 'count=1', 'conv=notrunc'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const check = fixDataDirFs(dataDir);
    assert.equal(check.ok, false);
    assert.match(check.detail, /image failed its check.*e2fsck -p/);
    assert.equal(own(), undefined, 'nothing is mounted over the data dir');
    assert.ok(existsSync(image), 'the image stays for a human to repair');
  });

  test('unmounting leaves no loop device and no mount', (t) => {
    const device = own()?.source;
    while (own()) umount(dataDir);
    const holders = device && loopsBackedUnder(base).size ? namespacesHolding(device) : [];
    if (holders.length) return t.skip(`${device} is still mounted in other mount namespaces made meanwhile: ${holders.join(', ')}`);
    umount(merged);
    assert.deepEqual([...loopsBackedUnder(base)], []);
    assert.deepEqual(mountsBelow(base), []);
  });
});
