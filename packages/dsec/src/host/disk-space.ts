import { statfsSync } from 'node:fs';

/** Bytes an unprivileged writer may still use on the filesystem holding `dir` (statfs f_bavail). */
export function freeBytes(dir: string): number {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

const NO_SPACE = /No space left on device|ENOSPC|database or disk is full|SQLITE_FULL|Disk quota exceeded|EDQUOT/i;

/**
 * Whether an error is the disk running out: an errno ENOSPC/EDQUOT (Node fs), SQLite's
 * SQLITE_FULL, or a tool whose stderr says so (mkfs.erofs, crun, tar: "No space left on device").
 */
export function isDiskFull(err: unknown): boolean {
  if (!err || typeof err !== 'object') return false;
  const e = err as { code?: unknown; message?: unknown; cause?: unknown };
  if (e.code === 'ENOSPC' || e.code === 'EDQUOT' || e.code === 'SQLITE_FULL') return true;
  if (typeof e.message === 'string' && NO_SPACE.test(e.message)) return true;
  return e.cause !== undefined && e.cause !== err && isDiskFull(e.cause);
}

/** What to free, said the same way wherever a full disk is reported. */
export const FREE_SPACE_HINT =
  'free space on the node: kill sandboxes you no longer need, delete unused snapshots and images (dsec images rm), volumes, and old files under the data dir';
