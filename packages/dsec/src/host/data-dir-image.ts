import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, renameSync, rmSync, truncateSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { freeBytes } from './disk-space.js';
import { readMounts, type MountEntry } from './mounts.js';

/**
 * A disk for a data dir whose own filesystem is overlayfs (dsec in a container, `fresh-machine`):
 * a sparse ext4 image beside the data dir, loop-mounted over it. overlayfs can neither be an
 * overlay upper nor back a file-backed EROFS mount, so the data dir needs a filesystem of its own;
 * a tmpfs is one, but then everything a sandbox writes to its upper is RAM charged to the
 * sandbox's memory cgroup (1.5 GB into a sandbox's /tmp was OOM-killed), and the state is lost
 * with the mount. On ext4 it is page cache the kernel can write back and reclaim, on disk.
 *
 * The loop device comes from mount(8)'s `-o loop`, as for a sandbox's upper disk
 * (edge/backends/container/upper-disk.ts): mount(8) attaches it with autoclear, so it exists only
 * while the mount does. An unmount, a lazy one whose last user goes later, or the end of the
 * mount namespace that held it (a container's, fresh-machine's) detaches it; a crash between
 * attaching and mounting leaves nothing, where `losetup --find` would leave an attached device.
 * mount(8) also reuses a device that already holds the image, so a second mount of it (another
 * namespace, a restart) shares the one ext4 instead of opening a second one over the same file.
 */

/** The image sits beside the data dir (not in it: it is what gets mounted there). */
export function dataDirImagePath(dataDir: string): string {
  return `${dataDir}.img`;
}

const GiB = 1024 ** 3;
/** An image smaller than this is not worth making: the host is nearly out of disk. */
export const IMAGE_MIN_BYTES = 2 * GiB;
/**
 * The largest image made. ext4's metadata grows with the size (a 1 TiB image takes 0.15 s to
 * make and a 1 GiB journal, lazily written); a data dir wanting more belongs on a host disk.
 */
export const IMAGE_MAX_BYTES = 1024 * GiB;
/** The share of the free disk the image may grow to: it is sparse, so it holds only what is written. */
const IMAGE_SHARE_OF_FREE = 0.75;
/** imageSizeBytes in words, for what doctor prints. */
export const IMAGE_SIZE_RULE = `3/4 of the free disk under it, at most ${IMAGE_MAX_BYTES / GiB} GiB`;

/**
 * The size of a new image: 3/4 of the free space under the overlay (statfs of an overlayfs reports
 * its upper's filesystem), at most IMAGE_MAX_BYTES, a whole number of MiB. Never more than is
 * free, so writes into the image do not meet a full disk below it (an I/O error in ext4, not
 * ENOSPC); undefined below IMAGE_MIN_BYTES.
 */
export function imageSizeBytes(free: number): number | undefined {
  const size = Math.min(IMAGE_MAX_BYTES, Math.floor((free * IMAGE_SHARE_OF_FREE) / 2 ** 20) * 2 ** 20);
  return size >= IMAGE_MIN_BYTES ? size : undefined;
}

export type ImageMount =
  | { ok: true; image: string; device: string; sizeBytes: number; made: boolean }
  /** `keepOff`: the image holds data that failed its check; nothing may be mounted over the data dir instead. */
  | { ok: false; reason: string; keepOff: boolean };

/**
 * Mounts the data dir's image over it, making the image first when there is none. An image that
 * exists is never formatted again: it is checked (`e2fsck -p`, which replays the journal and fixes
 * what is safe) unless a loop device holds it already, and mounted. Synchronous: doctor runs once,
 * before the server starts.
 */
export function mountDataDirImage(dataDir: string): ImageMount {
  if (!existsSync('/dev/loop-control')) return { ok: false, reason: 'no /dev/loop-control (no loop devices here)', keepOff: false };
  const image = dataDirImagePath(dataDir);
  let made = false;
  if (!existsSync(image)) {
    const size = imageSizeBytes(freeBytes(dirname(image)));
    if (size === undefined)
      return {
        ok: false,
        reason: `less than ${(IMAGE_MIN_BYTES / GiB / IMAGE_SHARE_OF_FREE).toFixed(1)} GiB free under ${dirname(image)}`,
        keepOff: false,
      };
    const failed = makeImage(image, size);
    if (failed) return { ok: false, reason: failed, keepOff: false };
    made = true;
  } else if (!attachedLoopDevice(image)) {
    // After a reboot, or once the namespace that mounted it is gone. A device that holds the
    // image may have it mounted (elsewhere): checking it then would race the live ext4.
    const r = spawnSync('e2fsck', ['-p', image], { encoding: 'utf8' });
    // 0: clean, 1: errors fixed; 2 (fixed, reboot) is for a mounted root; 4 and up: not fixed.
    if (r.error || (r.status ?? 8) >= 4)
      return { ok: false, reason: `e2fsck -p ${image} exited ${r.status ?? r.error?.message}: ${toolOutput(r)}`, keepOff: true };
  }
  // nosuid, and not nodev: a Debian build's debootstrap makes and uses device nodes under DATA/tmp;
  // the sandboxes directory below gets nosuid,nodev of its own (edge/sandboxes-mount.ts).
  const r = spawnSync('mount', ['-t', 'ext4', '-o', 'loop,nosuid', image, dataDir], { encoding: 'utf8' });
  if (r.error || r.status !== 0) {
    if (made) rmSync(image, { force: true });
    return { ok: false, reason: `mount -o loop ${image}: ${toolOutput(r)}`, keepOff: false };
  }
  const device = readMounts().findLast((m) => m.mountPoint === dataDir)?.source ?? '?';
  return { ok: true, image, device, sizeBytes: sizeOf(device), made };
}

/**
 * Makes the image under a temporary name and renames it into place once formatted, so that an
 * image at the final name always holds a filesystem (a crash mid-mkfs leaves a `.new` file,
 * overwritten next time). Returns why it failed, or undefined.
 */
function makeImage(image: string, size: number): string | undefined {
  const partial = `${image}.new`;
  try {
    closeSync(openSync(partial, 'w'));
    truncateSync(partial, size);
  } catch (err) {
    rmSync(partial, { force: true });
    return `could not make ${partial}: ${(err as Error).message}`;
  }
  // With a journal: the state store and layer blobs on it survive a host crash with a journal
  // replay, not a full check. Lazy inode-table and journal init and no discard keep the file
  // sparse (a 57 GiB image: 4.7 MiB on disk after mkfs, 65 ms); -m 0: only root writes here.
  const r = spawnSync(
    'mkfs.ext4',
    ['-q', '-F', '-m', '0', '-L', basename(image).slice(0, 16), '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', partial],
    { encoding: 'utf8' },
  );
  if (r.error || r.status !== 0) {
    rmSync(partial, { force: true });
    return `mkfs.ext4 ${partial}: ${toolOutput(r)}`;
  }
  renameSync(partial, image);
  return undefined;
}

/** The loop device holding `image` (by device and inode, as losetup compares), or undefined. */
function attachedLoopDevice(image: string): string | undefined {
  const r = spawnSync('losetup', ['--noheadings', '--output', 'NAME', '--associated', image], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.split('\n').find(Boolean)?.trim() : undefined;
}

/** A block device's size in bytes (sysfs counts 512-byte sectors whatever the device's block size). */
function sizeOf(device: string): number {
  try {
    return Number(readFileSync(`/sys/class/block/${basename(device)}/size`, 'utf8').trim()) * 512;
  } catch {
    return 0;
  }
}

/** The file a loop device reads and writes, or undefined when `mount` is not on a loop device. */
export function loopBackingFile(mount: MountEntry): string | undefined {
  const m = /^\/dev\/(loop\d+)$/.exec(mount.source);
  if (!m) return undefined;
  try {
    return readFileSync(`/sys/class/block/${m[1]}/loop/backing_file`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

function toolOutput(r: { stderr?: string | null; stdout?: string | null; error?: Error | undefined }): string {
  return (r.error?.message ?? r.stderr?.trim()) || r.stdout?.trim() || '(no output)';
}
