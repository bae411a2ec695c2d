import { chmodSync, mkdirSync } from 'node:fs';
import { readMounts } from '../../../host/mounts.js';
import { MNT_DETACH, MS_NODEV, MS_NOSUID, mount, umount } from '../../../host/syscalls.js';

const MS_REMOUNT = 0x20;
const MS_BIND = 0x1000;

/**
 * Makes the directory that holds every sandbox's upper, work and rootfs dirs a mount of its own,
 * `nosuid,nodev`, and 0700. A sandbox is root in its own root: it can `chmod 4755` a copy of a
 * shell or `mknod` a device in its writable layer. The overlay is mounted nosuid,nodev, but the
 * upper dir is also reachable on the host's own filesystem; binding the directory onto itself
 * with nosuid,nodev makes that path inert too, on any filesystem (ext4, tmpfs, an overlay root),
 * and 0700 keeps unprivileged host users from reaching the files at all.
 * Idempotent: an edge restarted beside running sandboxes finds the mount in place. A data dir
 * from before this defence, with sandboxes still mounted in it, is left as it is (binding over
 * them would hide their mounts from teardown) and secured at the first start without them.
 * Returns whether the directory is secured.
 */
export function secureSandboxesDir(dir: string): boolean {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const mounts = readMounts();
  const own = mounts.findLast((m) => m.mountPoint === dir);
  if (own?.options.includes('nosuid') && own.options.includes('nodev')) return true;
  if (!own && mounts.some((m) => m.mountPoint.startsWith(`${dir}/`))) return false;
  if (!own) mount(dir, dir, '', MS_BIND, null);
  mount('', dir, '', MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, null);
  return true;
}

/**
 * Removes the bind mount once no sandbox lives under it (an edge shut down with killAll), so the
 * data dir can be deleted. Left in place while sandboxes remain: their rootfs mounts sit on it.
 */
export function releaseSandboxesDir(dir: string): void {
  const mounts = readMounts();
  if (!mounts.some((m) => m.mountPoint === dir)) return;
  if (mounts.some((m) => m.mountPoint.startsWith(`${dir}/`))) return;
  for (let i = 0; i < 4 && readMounts().some((m) => m.mountPoint === dir); i++) umount(dir, MNT_DETACH);
}
