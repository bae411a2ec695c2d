import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isMountPoint, mountsUnder } from '../../../host/mounts.js';
import { MNT_DETACH, MS_BIND, MS_NODEV, MS_NOSUID, mount, umount } from '../../../host/syscalls.js';
import { unmountSandboxDir } from './sandbox-unmount.js';

const root = process.getuid?.() === 0 ? mkdtempSync(join(tmpdir(), 'dsec-unmount-test-')) : '';
after(() => {
  if (!root) return;
  for (const m of mountsUnder(root).reverse()) umount(m.mountPoint, MNT_DETACH); // only what a failed test left
  rmSync(root, { recursive: true, force: true });
});

test(
  "unmountSandboxDir finds and unmounts what the edge mounts in a sandbox dir without the mount table, the volume's data untouched",
  { skip: root ? undefined : 'mounting needs root' },
  () => {
    const dir = join(root, 'sb');
    const volumeData = join(root, 'volume-data');
    mkdirSync(volumeData);
    writeFileSync(join(volumeData, 'keep'), 'data');
    const tmpfs = (p: string): void => {
      mkdirSync(p, { recursive: true });
      mount('tmpfs', p, 'tmpfs', MS_NOSUID | MS_NODEV, 'size=1m');
    };
    tmpfs(join(dir, 'disk')); // the size-limited upper's filesystem
    mkdirSync(join(dir, 'disk', 'upper'));
    tmpfs(join(dir, 'rootfs'));
    tmpfs(join(dir, 'rootfs')); // stacked: a crash and a retry
    mkdirSync(join(dir, 'volumes', '0'), { recursive: true });
    mount(volumeData, join(dir, 'volumes', '0'), '', MS_BIND, null); // same filesystem: rm --one-file-system would go through it
    writeFileSync(join(dir, 'userns'), '');
    mount(join(volumeData, 'keep'), join(dir, 'userns'), '', MS_BIND, null);
    mkdirSync(join(dir, 'run'));
    symlinkSync(join(dir, 'rootfs'), join(dir, 'link-to-rootfs'));

    assert.ok(isMountPoint(join(dir, 'rootfs')) && isMountPoint(join(dir, 'volumes', '0')) && isMountPoint(join(dir, 'userns')));
    assert.equal(isMountPoint(join(dir, 'run')), false);
    assert.equal(isMountPoint(join(dir, 'link-to-rootfs')), false, 'a link is its own entry, not followed');
    assert.equal(isMountPoint(join(dir, 'nothing-here')), false);

    assert.deepEqual(unmountSandboxDir(dir), []);
    assert.deepEqual(mountsUnder(dir), [], 'the mount table still has mounts in the dir');
    rmSync(dir, { recursive: true });
    assert.equal(readFileSync(join(volumeData, 'keep'), 'utf8'), 'data', "the volume's data went with the dir");
    assert.deepEqual(unmountSandboxDir(join(root, 'gone')), [], 'a dir that is not there has nothing to unmount');
    assert.ok(!existsSync(dir));
  },
);
