import { readFileSync, writeFileSync } from 'node:fs';
import { mount, SyscallError } from '../../../host/syscalls.js';
import { readMounts } from '../../../host/mounts.js';

const CONNECTIONS = '/sys/fs/fuse/connections';

/**
 * The FUSE connection behind a mount point, from /proc/self/mountinfo (never a stat of the mount:
 * that would wait on a daemon that is hung). The kernel names a connection in
 * /sys/fs/fuse/connections by the superblock's device number: for FUSE (an anonymous device,
 * major 0) that is its minor.
 */
export function fuseConnectionOf(mountPoint: string): number | undefined {
  let found: number | undefined;
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [pre, post] = line.split(' - ');
    const f = pre?.split(' ') ?? [];
    if (f[4] !== mountPoint || !post?.startsWith('fuse')) continue;
    const [major, minor] = (f[2] ?? '').split(':').map(Number);
    if (major === 0 && Number.isInteger(minor)) found = minor; // the last (topmost) mount wins
  }
  return found;
}

/**
 * Aborts the FUSE connection under a mount point: every request waiting on the daemon, and every
 * later one, fails with ENOTCONN at once, so no reader of a layer on it can hang. True if aborted.
 */
export function abortFuseConnection(mountPoint: string): boolean {
  const conn = fuseConnectionOf(mountPoint);
  if (conn === undefined) return false;
  ensureFusectl();
  try {
    writeFileSync(`${CONNECTIONS}/${conn}/abort`, '1');
    return true;
  } catch {
    return false; // already gone
  }
}

/** The fusectl file system (where connections are aborted) is not mounted on a fresh host: mount it once. */
export function ensureFusectl(): void {
  if (readMounts().some((m) => m.mountPoint === CONNECTIONS && m.fsType === 'fusectl')) return;
  try {
    mount('fusectl', CONNECTIONS, 'fusectl', 0, null);
  } catch (err) {
    if (!(err instanceof SyscallError && err.code === 'EBUSY')) throw err; // EBUSY: mounted meanwhile
  }
}
