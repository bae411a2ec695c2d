import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { dataDirImagePath, IMAGE_SIZE_RULE, loopBackingFile, mountDataDirImage } from './data-dir-image.js';
import type { Check } from './host-check.js';
import { filesystemOf, readMounts } from './mounts.js';
import { MS_NOSUID, MS_REMOUNT, mount } from './syscalls.js';

const NAME = 'data dir filesystem';
const GiB = 1024 ** 3;

/**
 * EROFS blobs on overlayfs cannot be mounted file-backed, and an overlayfs cannot be an overlay
 * upper dir. When the data dir sits on overlayfs (dsec itself running in a container), it gets a
 * disk of its own: a sparse ext4 image beside it, loop-mounted over it (data-dir-image.ts). Where
 * no loop device can be had, a tmpfs instead, which the check says: sandboxes work, but what they
 * write is RAM charged to their memory limit and the data dir does not survive a reboot.
 */
export function fixDataDirFs(dataDir: string): Check {
  mkdirSync(dataDir, { recursive: true });
  const own = readMounts().findLast((m) => m.mountPoint === dataDir);
  if (own?.fsType === 'tmpfs') return keepTmpfs(dataDir, own.options);
  const fs = filesystemOf(dataDir);
  if (fs !== 'overlay') {
    const image = own && loopBackingFile(own);
    return { name: NAME, ok: true, detail: `${dataDir} is on ${fs}${image ? ` (${image} on ${own.source})` : ''}`, required: true };
  }
  const disk = mountDataDirImage(dataDir);
  if (disk.ok) {
    const what = `${dataDir} is on ext4 (${disk.image} on ${disk.device}, ${(disk.sizeBytes / GiB).toFixed(1)} GiB sparse)`;
    return {
      name: NAME,
      ok: true,
      detail: what,
      fixed: disk.made
        ? `${dataDir} was on overlayfs, which can back neither EROFS layer files nor overlay upper dirs: made the sparse ext4 image ${disk.image} (${IMAGE_SIZE_RULE}) and mounted it there through ${disk.device}`
        : `${dataDir} was on overlayfs: mounted its ext4 image ${disk.image}, kept from an earlier run, there through ${disk.device}`,
      required: true,
    };
  }
  if (disk.keepOff)
    return {
      name: NAME,
      ok: false,
      detail: `${dataDir} is on overlayfs and its image failed its check, so nothing was mounted over it (repair or move the image away): ${disk.reason}`,
      required: true,
    };
  return mountTmpfs(dataDir, disk.reason);
}

/** The stated fallback: a tmpfs over the data dir, when no loop-mounted image can be had. */
function mountTmpfs(dataDir: string, whyNoDisk: string): Check {
  try {
    // Not nodev: a Debian build's debootstrap makes and uses device nodes under DATA/tmp. The
    // sandboxes directory below gets nosuid,nodev of its own (edge/sandboxes-mount.ts).
    mount('tmpfs', dataDir, 'tmpfs', MS_NOSUID, 'mode=0711,size=50%');
  } catch (err) {
    return {
      name: NAME,
      ok: false,
      detail: `${dataDir} is on overlayfs, no disk image could be mounted (${whyNoDisk}), and neither could a tmpfs: ${(err as Error).message}`,
      required: true,
    };
  }
  return {
    name: NAME,
    ok: true,
    detail: `${dataDir} is on tmpfs (in memory)`,
    fixed: `${dataDir} was on overlayfs, which can back neither EROFS layer files nor overlay upper dirs, and no disk image could be mounted there (${whyNoDisk}): mounted a tmpfs instead, so what sandboxes write is memory charged to their limits and the state will not survive a reboot`,
    required: true,
  };
}

/** A tmpfs mounted by an earlier doctor (or by hand) stays: unmounting it would lose its state. */
function keepTmpfs(dataDir: string, options: string[]): Check {
  // Doctor's fallback over an overlay root (the tmpfs hides what is below; its parent is not hidden).
  const overOverlay = filesystemOf(dirname(dataDir)) === 'overlay';
  const detail = overOverlay
    ? `${dataDir} is on tmpfs (in memory; to move it to a disk image at ${dataDirImagePath(dataDir)}, unmount it, which drops its state, and run dsec doctor again)`
    : `${dataDir} is on tmpfs`;
  if (!options.includes('nodev')) return { name: NAME, ok: true, detail, required: true };
  // An older doctor mounted it nodev: debootstrap cannot use the device nodes it makes there.
  try {
    mount('tmpfs', dataDir, 'tmpfs', MS_REMOUNT | MS_NOSUID, null);
  } catch (err) {
    return {
      name: NAME,
      ok: false,
      detail: `${dataDir} is a nodev tmpfs and could not be remounted without nodev: ${(err as Error).message}`,
      required: true,
    };
  }
  return {
    name: NAME,
    ok: true,
    detail,
    fixed: `remounted the tmpfs on ${dataDir} without nodev (image builds make device nodes there)`,
    required: true,
  };
}
