import {
  type Stats, chmodSync, copyFileSync, constants as fsc, linkSync, lchownSync, lstatSync, lutimesSync, mkdirSync, readdirSync, readlinkSync,
  symlinkSync,
} from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { getXattr, listXattrs, mknod, setXattr } from '../host/syscalls.js';

/**
 * Overlay bookkeeping in an upper dir that means nothing in a new image layer (file handles of
 * this node's layers, "impure" dir markers, the upper's uuid). Only `opaque` carries meaning:
 * a directory that hides everything below it.
 */
export function keepXattr(name: string): boolean {
  if (name.startsWith('trusted.overlay.')) return name === 'trusted.overlay.opaque';
  return true;
}

/** Paths (inside the sandbox) never captured in a snapshot: package caches and logs. */
export const DEFAULT_SCRUB = ['/var/cache/apt/archives', '/var/lib/apt/lists', '/root/.cache', '/var/log/apt', '/tmp/.dsec'];

export interface DiffStats {
  entries: number;
  bytes: number;
  whiteouts: number;
  opaqueDirs: number;
  /** Files with holes (blocks < size): the layer must be built in chunked mode to keep them sparse. */
  sparseFiles: number;
}

function isScrubbed(rel: string, scrub: string[]): boolean {
  return scrub.some((s) => rel === s || rel.startsWith(s.endsWith('/') ? s : `${s}/`));
}

function copyMeta(src: string, dest: string, st: Stats, isLink: boolean): void {
  for (const name of listXattrs(src)) if (keepXattr(name)) setXattr(dest, name, getXattr(src, name));
  lchownSync(dest, st.uid, st.gid);
  if (!isLink) chmodSync(dest, st.mode & 0o7777);
}

/**
 * pack_diff's capture step: copies a sandbox's overlay upper dir (a frozen one) into `stage` as
 * a layer tree: whiteouts (char 0:0) and opaque dirs kept, overlay-internal xattrs stripped,
 * hard links kept as links, owners, modes, times and other xattrs kept, scrub paths left out.
 * The copy is what lets the sandbox thaw while mkfs.erofs runs.
 */
export function stageUpperDiff(upper: string, stage: string, scrub: string[] = DEFAULT_SCRUB): DiffStats {
  const stats: DiffStats = { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 };
  const inodes = new Map<string, string>();
  const dirTimes: [string, Stats][] = [];

  const walk = (rel: string): void => {
    for (const name of readdirSync(join(upper, rel))) {
      const childRel = `${rel}/${name}`;
      if (isScrubbed(childRel, scrub)) continue;
      const src = join(upper, childRel);
      const dest = join(stage, childRel);
      const st = lstatSync(src);
      stats.entries++;
      if (st.isDirectory()) {
        mkdirSync(dest);
        copyMeta(src, dest, st, false);
        if (listXattrs(src).includes('trusted.overlay.opaque')) stats.opaqueDirs++;
        walk(childRel);
        dirTimes.push([dest, st]);
        continue;
      }
      const key = `${st.dev}:${st.ino}`;
      if (st.nlink > 1 && inodes.has(key)) {
        linkSync(inodes.get(key)!, dest);
        continue;
      }
      if (st.isFile()) {
        // A sparse file (fewer blocks than its size) is copied hole for hole by cp, so a 10 GB
        // truncate does not become 10 GB of zeros on disk.
        if (st.blocks * 512 < st.size) {
          execFileSync('cp', ['--sparse=always', '--', src, dest]);
          stats.sparseFiles++;
        } else copyFileSync(src, dest, fsc.COPYFILE_FICLONE);
        stats.bytes += st.size;
      } else if (st.isSymbolicLink()) {
        symlinkSync(readlinkSync(src), dest);
      } else if (st.isCharacterDevice() || st.isBlockDevice() || st.isFIFO()) {
        mknod(dest, st.mode, st.rdev);
        if (st.isCharacterDevice() && st.rdev === 0) stats.whiteouts++;
      } else continue; // sockets belong to running processes, not to an image
      copyMeta(src, dest, st, st.isSymbolicLink());
      lutimesSync(dest, st.atime, st.mtime);
      if (st.nlink > 1) inodes.set(key, dest);
    }
  };
  walk('');
  // Directory times last: creating children changed them.
  for (const [dest, st] of dirTimes.reverse()) lutimesSync(dest, st.atime, st.mtime);
  return stats;
}
