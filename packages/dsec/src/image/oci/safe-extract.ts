import {
  type Stats,
  chmodSync,
  constants as fsc,
  lchownSync,
  linkSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  rmSync,
  symlinkSync,
  unlinkSync,
} from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import koffi from 'koffi';
import { mknod, setXattr } from '../../host/syscalls.js';
import { DiffLimitError, type DiffLimits } from '../pack-diff.js';
import { readTar, type TarHeader } from './tar-reader.js';

/**
 * Safe extraction of an untrusted tar archive into a private scratch directory.
 *
 * - Paths are cleaned lexically: a leading `/` is dropped, `.` and empty parts go, `..` pops a
 *   part; an entry that would climb above the root is skipped with a warning.
 * - Nothing is ever followed: every parent directory is checked with lstat as the path is built,
 *   and a non-directory standing where a directory is needed (a symlink to `/`, say) is replaced
 *   by a real directory (a later entry wins, as tar and overlayfs do). Files are created with
 *   O_EXCL|O_NOFOLLOW after the old entry is removed, so no write goes through a symlink.
 * - Hard links must point at an entry already extracted in this archive (not a directory).
 * - Layer mode converts OCI whiteouts to overlayfs form (`.wh.NAME` → char device 0:0 NAME,
 *   `.wh..wh..opq` → trusted.overlay.opaque=y), keeps owners, device nodes and a safe subset of
 *   xattrs (user.*, security.capability); trusted.overlay.* from an archive is always dropped.
 *
 * The scratch root must be private to the caller (mkdtemp: mode 0700), so no other process can
 * change the tree between the checks and the writes.
 */

export interface ExtractOptions {
  /** OCI layer semantics (whiteouts, owners, devices, xattrs); off for an outer archive of blobs. */
  layer: boolean;
  warn: (message: string) => void;
  /** Names the archive in messages: "layer 2 (sha256:…)". */
  label: string;
  /**
   * Bounds for an archive that becomes a snapshot's layer (a guest's disk diff), as pack_diff's
   * for a container: entries (whiteouts included), file bytes, and path length (PATH_MAX under
   * the scratch root, which mkfs.erofs must be able to pack). Over one: DiffLimitError.
   */
  limits?: DiffLimits & { maxPathBytes: number };
}

export interface ExtractStats {
  entries: number;
  bytes: number;
  whiteouts: number;
  opaqueDirs: number;
  skipped: number;
}

export class UnsafeArchiveError extends Error {
  override readonly name = 'UnsafeArchiveError';
}

const S_IFCHR = 0o020000;
const S_IFBLK = 0o060000;
const S_IFIFO = 0o010000;
export const WHITEOUT_PREFIX = '.wh.';
export const OPAQUE_MARKER = '.wh..wh..opq';
export const OPAQUE_XATTR = 'trusted.overlay.opaque';

const libc = koffi.load('libc.so.6');
const lremovexattrFn = libc.func('int lremovexattr(const char *path, const char *name)');

/** Removes an extended attribute (not following a final symlink); a missing one is not an error. */
export function removeXattr(path: string, name: string): void {
  if (lremovexattrFn(path, name) !== 0) {
    const errno = koffi.errno();
    if (errno !== 61 /* ENODATA */) throw new Error(`lremovexattr(${path}, ${name}) failed: errno ${errno}`);
  }
}

/** glibc's makedev(): the dev_t of a device number pair. */
export function makedev(major: number, minor: number): number {
  return (major & 0xfff) * 0x100 + Math.floor(major / 0x1000) * 2 ** 44 + (minor & 0xff) + Math.floor(minor / 0x100) * 2 ** 20;
}

/** `a/./b//../c` → `a/c`; undefined when the path climbs above the root. '' is the root itself. */
export function cleanArchivePath(name: string): string | undefined {
  const parts: string[] = [];
  for (const p of name.split('/')) {
    if (p === '' || p === '.') continue;
    if (p === '..') {
      if (parts.length === 0) return undefined;
      parts.pop();
    } else parts.push(p);
  }
  return parts.join('/');
}

export function lstatOrUndefined(path: string): Stats | undefined {
  try {
    return lstatSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

export function isWhiteoutStat(st: Stats): boolean {
  return st.isCharacterDevice() && st.rdev === 0;
}

export function allowedXattr(name: string): boolean {
  return name.startsWith('user.') || name === 'security.capability';
}

function checkLimits(
  limits: DiffLimits & { maxPathBytes: number },
  root: string,
  rel: string,
  h: TarHeader,
  entries: number,
  bytes: number,
): void {
  const room = limits.maxPathBytes - Buffer.byteLength(root) - 1;
  if (Buffer.byteLength(rel) > room) {
    throw new DiffLimitError(
      `the sandbox has a path too long to snapshot (${Buffer.byteLength(rel)} bytes, beginning ${JSON.stringify(rel.slice(0, 80))}): a layer holds paths up to ${room} bytes; remove or shorten that tree first`,
      { path: rel.slice(0, 256), maxPathBytes: room },
    );
  }
  if (entries >= limits.maxEntries) {
    throw new DiffLimitError(
      `the sandbox changed more than ${limits.maxEntries} files and directories; a snapshot holds at most that many`,
      { maxEntries: limits.maxEntries },
    );
  }
  if (h.type === 'file' && bytes + h.size > limits.maxBytes) {
    throw new DiffLimitError(
      `the sandbox's changes exceed ${limits.maxBytes} bytes (apparent size, sparse files in full; ${JSON.stringify(rel.slice(0, 80))} reached it); a snapshot holds at most that much`,
      { maxBytes: limits.maxBytes, path: rel.slice(0, 256) },
    );
  }
}

export async function extractTarSafely(source: AsyncIterable<Buffer>, root: string, opts: ExtractOptions): Promise<ExtractStats> {
  const stats: ExtractStats = { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, skipped: 0 };
  /** Directories known to be real directories (relative paths); cleared when a tree is removed. */
  let knownDirs = new Set<string>(['']);
  const dirTimes = new Map<string, number>();
  const opaque = new Set<string>();
  const whiteouts = new Set<string>();
  const droppedXattrs = new Set<string>();
  const warnedKinds = new Set<string>();
  const warnOnce = (kind: string, message: string): void => {
    if (warnedKinds.has(kind)) return;
    warnedKinds.add(kind);
    opts.warn(message);
  };

  /** Makes every parent of `rel` a real directory; returns the absolute path of `rel`. */
  const prepareParents = (rel: string): string => {
    const parts = rel.split('/');
    let cur = '';
    for (let i = 0; i < parts.length - 1; i++) {
      cur = cur ? `${cur}/${parts[i]}` : parts[i]!;
      if (knownDirs.has(cur)) continue;
      const abs = join(root, cur);
      const st = lstatOrUndefined(abs);
      if (st && !st.isDirectory()) {
        opts.warn(
          `${opts.label}: ${cur} is a ${st.isSymbolicLink() ? 'symlink' : 'non-directory'} but entries are stored under it; replaced by a directory (nothing is followed)`,
        );
        unlinkSync(abs);
      }
      if (!st || !st.isDirectory()) {
        mkdirSync(abs, { mode: 0o755 });
        dirTimes.delete(cur);
      }
      knownDirs.add(cur);
    }
    return join(root, rel);
  };

  const applyMeta = (abs: string, h: TarHeader, kind: 'dir' | 'file' | 'symlink' | 'node'): void => {
    if (opts.layer) {
      lchownSync(abs, h.uid, h.gid);
      for (const [name, value] of h.xattrs) {
        if (allowedXattr(name)) setXattr(abs, name, value);
        else droppedXattrs.add(name);
      }
    }
    if (kind !== 'symlink') chmodSync(abs, h.mode & (opts.layer ? 0o7777 : 0o777)); // after chown, which clears setuid bits
    if (kind !== 'dir') lutimesSync(abs, h.mtime, h.mtime);
  };

  for await (const { header: h, body } of readTar(source)) {
    const rel = cleanArchivePath(h.name);
    if (rel === undefined) {
      opts.warn(`${opts.label}: skipped ${JSON.stringify(h.name)}: the path leads outside the archive root`);
      stats.skipped++;
      continue;
    }
    if (h.name.startsWith('/'))
      warnOnce('absolute', `${opts.label}: absolute entry names (like ${JSON.stringify(h.name)}) were made relative to the layer root`);
    const base = rel.slice(rel.lastIndexOf('/') + 1);
    const parent = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : '';
    if (opts.limits) checkLimits(opts.limits, root, rel, h, stats.entries + whiteouts.size + opaque.size, stats.bytes);

    if (opts.layer && base.startsWith(WHITEOUT_PREFIX)) {
      if (h.type !== 'file' && h.type !== 'link') {
        opts.warn(`${opts.label}: skipped whiteout ${rel}: it is a ${h.type}, not a plain file`);
        stats.skipped++;
      } else if (base === OPAQUE_MARKER) {
        if (parent) prepareParents(`${parent}/x`);
        opaque.add(parent);
      } else if (base.startsWith(`${WHITEOUT_PREFIX}${WHITEOUT_PREFIX}`)) {
        warnOnce('aufs', `${opts.label}: skipped aufs metadata entries (${rel})`);
        stats.skipped++;
      } else {
        const target = base.slice(WHITEOUT_PREFIX.length);
        if (target === '' || target === '.' || target === '..') {
          opts.warn(`${opts.label}: skipped malformed whiteout ${rel}`);
          stats.skipped++;
        } else whiteouts.add(parent ? `${parent}/${target}` : target);
      }
      continue;
    }

    if (rel === '') {
      // The layer's root directory: its metadata (mode, owner) is kept; anything else is nonsense.
      if (h.type === 'dir') {
        applyMeta(root, h, 'dir');
        dirTimes.set('', h.mtime);
      }
      continue;
    }

    const abs = prepareParents(rel);
    const existing = lstatOrUndefined(abs);
    stats.entries++;

    if (h.type === 'dir') {
      if (existing && !existing.isDirectory()) unlinkSync(abs);
      if (!existing || !existing.isDirectory()) mkdirSync(abs, { mode: 0o755 });
      knownDirs.add(rel);
      applyMeta(abs, h, 'dir');
      dirTimes.set(rel, h.mtime);
      continue;
    }

    // Everything else replaces what was there (a later entry wins).
    if (existing) {
      if (existing.isDirectory()) {
        rmSync(abs, { recursive: true, force: true });
        knownDirs = new Set(['']);
      } else unlinkSync(abs);
    }

    switch (h.type) {
      case 'file': {
        const fh = await open(abs, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
        try {
          for await (const chunk of body) {
            await fh.write(chunk);
            stats.bytes += chunk.length;
          }
        } finally {
          await fh.close();
        }
        applyMeta(abs, h, 'file');
        break;
      }
      case 'symlink':
        // The target is stored as is: it is only ever resolved inside the sandbox, never here.
        symlinkSync(h.linkname, abs);
        applyMeta(abs, h, 'symlink');
        break;
      case 'link': {
        const targetRel = cleanArchivePath(h.linkname);
        if (targetRel === undefined || targetRel === '') {
          throw new UnsafeArchiveError(`${opts.label}: hard link ${rel} points outside the archive (${JSON.stringify(h.linkname)})`);
        }
        // Walk the target's parents with lstat: a symlinked parent would lead out of the tree.
        let cur = root;
        for (const part of targetRel.split('/').slice(0, -1)) {
          cur = join(cur, part);
          if (!lstatOrUndefined(cur)?.isDirectory()) {
            throw new UnsafeArchiveError(
              `${opts.label}: hard link ${rel} → ${targetRel}: a parent of the target is not a directory in this archive`,
            );
          }
        }
        const target = join(root, targetRel);
        const tst = lstatOrUndefined(target);
        if (!tst)
          throw new UnsafeArchiveError(
            `${opts.label}: hard link ${rel} → ${targetRel}: the target is not in this archive (links into a lower layer are not supported)`,
          );
        if (tst.isDirectory()) throw new UnsafeArchiveError(`${opts.label}: hard link ${rel} → ${targetRel}: the target is a directory`);
        linkSync(target, abs); // link(2) does not follow a symlink target
        break;
      }
      case 'char':
      case 'block':
      case 'fifo': {
        if (!opts.layer) {
          warnOnce('devices', `${opts.label}: skipped device nodes and FIFOs (${rel})`);
          stats.skipped++;
          stats.entries--;
          break;
        }
        const kind = h.type === 'char' ? S_IFCHR : h.type === 'block' ? S_IFBLK : S_IFIFO;
        mknod(abs, kind | (h.mode & 0o777), h.type === 'fifo' ? 0 : makedev(h.devmajor, h.devminor));
        if (h.type === 'char' && h.devmajor === 0 && h.devminor === 0) stats.whiteouts++;
        applyMeta(abs, h, 'node');
        break;
      }
    }
  }

  if (opts.layer) {
    // OCI: whiteouts hide lower layers only. An entry of this layer with the same name wins; if
    // it is a directory it replaces the lower one entirely, which overlayfs spells "opaque".
    for (const rel of whiteouts) {
      const abs = prepareParents(rel);
      const st = lstatOrUndefined(abs);
      if (st?.isDirectory()) opaque.add(rel);
      else if (!st) {
        mknod(abs, S_IFCHR, 0);
        lchownSync(abs, 0, 0);
        stats.whiteouts++;
      }
    }
    for (const rel of opaque) {
      const abs = rel ? prepareParents(`${rel}/x`).slice(0, -2) : root;
      if (!lstatOrUndefined(abs)) mkdirSync(abs, { mode: 0o755 });
      if (rel === '') {
        opts.warn(`${opts.label}: an opaque marker at the layer root was ignored (overlayfs cannot hide the whole lower tree)`);
        continue;
      }
      setXattr(abs, OPAQUE_XATTR, Buffer.from('y'));
      stats.opaqueDirs++;
    }
    if (droppedXattrs.size)
      opts.warn(`${opts.label}: dropped extended attributes dsec does not import: ${[...droppedXattrs].sort().join(', ')}`);
  }
  // Directory times last: creating their children changed them. Deepest first.
  for (const [rel, mtime] of [...dirTimes].sort((a, b) => b[0].length - a[0].length)) {
    const abs = rel ? join(root, rel) : root;
    if (lstatOrUndefined(abs)?.isDirectory()) lutimesSync(abs, mtime, mtime);
  }
  return stats;
}
