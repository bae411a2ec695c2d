import { closeSync, mkdirSync, openSync, rmSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { runToolOrThrow } from '../../../host/run-tool.js';

/**
 * A size-limited filesystem for one sandbox's writable layer. This kernel has no quota support
 * (CONFIG_QUOTA is off: neither ext4 nor XFS project quotas mount), so a disk limit needs a
 * filesystem of its own: a sparse file formatted ext4 (no journal: the upper is scratch state
 * that dies with the host's processes anyway) and loop-mounted. Filling it fails inside the
 * sandbox with ENOSPC and the host disk only ever holds what the sandbox really wrote, up to
 * the limit. It costs a mkfs and a loop mount at create (~50 + ~20 ms), so it is per request
 * (resources.diskMiB), not the default.
 */
export async function mountUpperDisk(dir: string, sizeMiB: number): Promise<string> {
  const image = join(dir, 'disk.img');
  const mountPoint = join(dir, 'disk');
  closeSync(openSync(image, 'w'));
  truncateSync(image, sizeMiB * 1024 * 1024);
  try {
    await runToolOrThrow('mkfs.ext4', ['-q', '-F', '-O', '^has_journal', '-E', 'lazy_itable_init=1,nodiscard', '-m', '0', image]);
    mkdirSync(mountPoint, { recursive: true });
    // mount(8) sets up the loop device with autoclear: it goes away with the unmount.
    await runToolOrThrow('mount', ['-o', 'loop,nosuid,nodev', image, mountPoint]);
  } catch (err) {
    rmSync(image, { force: true });
    throw err;
  }
  return mountPoint;
}
