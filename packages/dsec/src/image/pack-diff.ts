import {
  type Stats,
  chmodSync,
  copyFileSync,
  constants as fsc,
  linkSync,
  lchownSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  readdirSync,
  readlinkSync,
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

/**
 * A user-namespaced sandbox's upper dir holds host ids (its root is host uid `base`): a layer
 * records the ids as the sandbox saw them, so the next sandbox's root owns its root's files
 * whatever its own range. A host id outside the range was nobody inside, and stays so.
 */
export interface IdRange {
  base: number;
  size: number;
}

const NOBODY = 65534;

function inRange(id: number, r: IdRange | undefined): number {
  if (!r) return id;
  return id >= r.base && id < r.base + r.size ? id - r.base : NOBODY;
}

function copyMeta(src: string, dest: string, st: Stats, isLink: boolean, ids: IdRange | undefined): void {
  for (const name of listXattrs(src)) if (keepXattr(name)) setXattr(dest, name, getXattr(src, name));
  lchownSync(dest, inRange(st.uid, ids), inRange(st.gid, ids));
  if (!isLink) chmodSync(dest, st.mode & 0o7777);
}

/** The longest path the kernel resolves (PATH_MAX, with its terminating NUL) and mkfs.erofs can pack. */
export const MAX_PATH_BYTES = 4095;

/**
 * How much one snapshot may copy. A sandbox shapes its upper dir: without bounds a 4 TiB sparse
 * file kept mkfs.erofs at a full core for good and 200k empty files stalled the copy for seconds.
 */
export interface DiffLimits {
  /** Files, directories, links and nodes. */
  maxEntries: number;
  /** Apparent bytes of regular files (a sparse file counts its full size: mkfs.erofs reads it all). */
  maxBytes: number;
}

export const DEFAULT_DIFF_LIMITS: DiffLimits = { maxEntries: 1_000_000, maxBytes: 64 * 2 ** 30 };

/** A sandbox's upper dir cannot become a layer (a path too long for mkfs.erofs, or over a limit). */
export class DiffLimitError extends Error {
  override readonly name = 'DiffLimitError';
  constructor(
    message: string,
    readonly details: Record<string, unknown>,
  ) {
    super(message);
  }
}

/**
 * pack_diff's capture step: copies a sandbox's overlay upper dir (a frozen one) into `stage` as
 * a layer tree: whiteouts (char 0:0) and opaque dirs kept, overlay-internal xattrs stripped,
 * hard links kept as links, owners, modes, times and other xattrs kept, scrub paths left out.
 * The copy is what lets the sandbox thaw while mkfs.erofs runs.
 *
 * The tree is the sandbox's to shape, so the walk is iterative (an explicit stack: no depth
 * can overflow the JS stack) and refuses, before touching it, any path whose staged copy would
 * not fit in PATH_MAX: the kernel cannot resolve it by name and mkfs.erofs (which works on full
 * paths) could not pack it. The caller removes `stage` whatever happens (host/remove-tree.ts
 * copes with any depth).
 */
export function stageUpperDiff(
  upper: string,
  stage: string,
  scrub: string[] = DEFAULT_SCRUB,
  limits: DiffLimits = DEFAULT_DIFF_LIMITS,
  ids?: IdRange,
): DiffStats {
  const stats: DiffStats = { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 };
  const inodes = new Map<string, string>();
  const dirTimes: [string, Stats][] = [];
  const longest = Math.max(Buffer.byteLength(upper), Buffer.byteLength(stage));
  const pending: string[] = [''];

  for (let rel = pending.pop(); rel !== undefined; rel = pending.pop()) {
    for (const name of readdirSync(join(upper, rel))) {
      const childRel = `${rel}/${name}`;
      if (isScrubbed(childRel, scrub)) continue;
      if (longest + Buffer.byteLength(childRel) > MAX_PATH_BYTES) {
        throw new DiffLimitError(
          `the sandbox has a path too long to snapshot (${Buffer.byteLength(childRel)} bytes, beginning ${JSON.stringify(childRel.slice(0, 80))}): ` +
            `a layer holds paths up to ${MAX_PATH_BYTES - longest} bytes; remove or shorten that tree first`,
          { path: childRel.slice(0, 256), maxPathBytes: MAX_PATH_BYTES - longest },
        );
      }
      const src = join(upper, childRel);
      const dest = join(stage, childRel);
      const st = lstatSync(src);
      stats.entries++;
      if (stats.entries > limits.maxEntries) {
        throw new DiffLimitError(
          `the sandbox changed more than ${limits.maxEntries} files and directories; a snapshot holds at most that many`,
          {
            maxEntries: limits.maxEntries,
          },
        );
      }
      if (st.isFile() && stats.bytes + st.size > limits.maxBytes) {
        throw new DiffLimitError(
          `the sandbox's changes exceed ${limits.maxBytes} bytes (apparent size, sparse files in full; ${JSON.stringify(childRel.slice(0, 80))} reached it); a snapshot holds at most that much`,
          { maxBytes: limits.maxBytes, path: childRel.slice(0, 256) },
        );
      }
      if (st.isDirectory()) {
        mkdirSync(dest);
        copyMeta(src, dest, st, false, ids);
        if (listXattrs(src).includes('trusted.overlay.opaque')) stats.opaqueDirs++;
        pending.push(childRel);
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
      copyMeta(src, dest, st, st.isSymbolicLink(), ids);
      lutimesSync(dest, st.atime, st.mtime);
      if (st.nlink > 1) inodes.set(key, dest);
    }
  }
  // Directory times last: creating children changed them.
  for (const [dest, st] of dirTimes) lutimesSync(dest, st.atime, st.mtime);
  return stats;
}
