import {
  type Stats,
  closeSync,
  fstatSync,
  lstatSync,
  openSync,
  readSync,
  readdirSync,
  readlinkSync,
  writeSync,
  fchmodSync,
  fchownSync,
  constants as fsc,
} from 'node:fs';
import { dirname } from 'node:path';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { FREE_SPACE_HINT, freeBytes } from '../../../host/disk-space.js';
import { type HostFsIds, withFsIds } from '../../../host/fs-ids.js';
import type { FileMetadataWrite } from '../../protocol/file-options.js';
import { readMetadata, writeMetadata } from './file-metadata.js';
import {
  AT_REMOVEDIR,
  O_CLOEXEC,
  O_DIRECTORY,
  O_PATH,
  RESOLVE_IN_ROOT,
  RESOLVE_NO_MAGICLINKS,
  RESOLVE_NO_XDEV,
  SyscallError,
  mkdirat,
  openat2,
  renameat,
  unlinkat,
} from '../../../host/syscalls.js';

/**
 * File access inside a sandbox's root from the host, through openat2(2) with RESOLVE_IN_ROOT:
 * the kernel resolves every component (`..`, absolute symlinks, symlinks swapped in between check
 * and use) as if the sandbox root were `/`, so no path from the API can reach a host file.
 * RESOLVE_NO_XDEV refuses to cross into any mount below the root.
 */
export const RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/**
 * A user of the sandbox a call acts as: the host ids the kernel checks (a user-namespaced
 * sandbox's mapped into its range) and its uid inside, for messages.
 */
export interface ActingUser {
  host: HostFsIds;
  uid: number;
}

/**
 * Runs `fn` on the sandbox's root, as `user` when one is given: the root is opened first, as the
 * edge (the sandboxes' dir is 0700 root), then everything below it is opened, made and removed
 * with the user's filesystem ids (host/fs-ids.ts), so the kernel decides each access as it would
 * for that user inside. `verb` words the permission error ("uid 1000 may not write /etc/x").
 */
export function withRoot<T>(rootfs: string, fn: (rootFd: number) => T, user?: ActingUser, verb = 'access'): T {
  const rootFd = openSync(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
  try {
    return user ? withFsIds(user.host, () => fn(rootFd)) : fn(rootFd);
  } catch (err) {
    permissionWorded(err, user, verb);
  } finally {
    closeSync(rootFd);
  }
}

/** Rethrows `err`, a permission error worded with who and what. */
export function permissionWorded(err: unknown, user: ActingUser | undefined, verb: string): never {
  if (!(err instanceof ApiError && err.code === 'FILE_PERMISSION_DENIED')) throw err;
  const path = String(err.details?.['path'] ?? '');
  const who = user ? `uid ${user.uid}` : "the sandbox's root";
  throw new ApiError('FILE_PERMISSION_DENIED', `permission denied: ${who} may not ${verb} ${path}`, {
    path,
    uid: user?.uid ?? 0,
  });
}

/**
 * ENOSPC writing into a sandbox: its own disk (a `diskMiB` limit: the caller's 413) or, when the
 * node's filesystem under the sandbox directory is what is full, the node's (507 NODE_DISK_FULL).
 */
function noSpace(path: string, rootfs: string | undefined): ApiError {
  if (rootfs !== undefined && freeBytes(dirname(rootfs)) < 1 << 20) {
    return new ApiError('NODE_DISK_FULL', `the node's disk is full writing ${path}; ${FREE_SPACE_HINT}`, { path });
  }
  return new ApiError('PAYLOAD_TOO_LARGE', `the sandbox disk is full writing ${path}`, { path });
}

/**
 * A path error from openat2 (SyscallError) or from Node's fs (ErrnoException) → the caller's 4xx.
 * A permission error names only the path here; withRoot words it with who and what.
 */
export function mapError(err: unknown, path: string, rootfs?: string): never {
  if (err instanceof ApiError) throw err;
  const code = err instanceof SyscallError ? err.code : err instanceof Error ? (err as NodeJS.ErrnoException).code : undefined;
  if (code !== undefined) {
    switch (code) {
      case 'EACCES':
      case 'EPERM':
        throw new ApiError('FILE_PERMISSION_DENIED', `permission denied: ${path}`, { path });
      case 'ENOENT':
        throw new ApiError('FILE_NOT_FOUND', `no such file in the sandbox: ${path}`, { path });
      case 'EISDIR':
        throw new ApiError('PATH_CONFLICT', `${path} is a directory`, { path });
      case 'ENOTDIR':
        throw new ApiError('PATH_CONFLICT', `a component of ${path} is not a directory`, { path });
      case 'EXDEV':
        throw new ApiError('INVALID_REQUEST', `${path} crosses a mount point, which the files API does not follow`, { path });
      case 'ELOOP':
        throw new ApiError('INVALID_REQUEST', `${path} has too many levels of symbolic links`, { path });
      case 'EEXIST':
        throw new ApiError('PATH_CONFLICT', `${path} changed while it was being written; retry`, { path });
      case 'ENAMETOOLONG':
        throw new ApiError('INVALID_REQUEST', `a name in ${path.length > 300 ? `${path.slice(0, 300)}…` : path} is longer than 255 bytes`, {
          path,
        });
      case 'EAGAIN':
        throw new ApiError('PATH_CONFLICT', `${path} kept changing while it was being resolved (a rename raced with it); retry`, { path });
      case 'ENOSPC':
        throw noSpace(path, rootfs);
    }
  }
  throw err;
}

/**
 * Opens an existing path as O_PATH inside the root, checks it is a regular file, then reopens that
 * same inode through /proc/self/fd: a FIFO or device node planted by the sandbox is never opened.
 */
function openRegular(rootFd: number, path: string, flags: number): number {
  let pathFd: number;
  try {
    pathFd = openat2(rootFd, path, O_PATH | O_CLOEXEC, 0, RESOLVE);
  } catch (err) {
    mapError(err, path);
  }
  try {
    const st = fstatSync(pathFd);
    if (st.isDirectory()) throw new ApiError('PATH_CONFLICT', `${path} is a directory`, { path });
    if (!st.isFile()) throw new ApiError('INVALID_REQUEST', `${path} is not a regular file`, { path });
    try {
      return openSync(`/proc/self/fd/${pathFd}`, flags | O_CLOEXEC);
    } catch (err) {
      mapError(err, path);
    }
  } finally {
    closeSync(pathFd);
  }
}

export function readFileInRoot(rootfs: string, path: string, maxBytes: number, user?: ActingUser): Buffer {
  return withRoot(
    rootfs,
    (rootFd) => {
      const fd = openRegular(rootFd, path, fsc.O_RDONLY);
      try {
        const st = fstatSync(fd);
        if (st.size > maxBytes) {
          throw new ApiError('PAYLOAD_TOO_LARGE', `${path} is ${st.size} bytes, over the ${maxBytes}-byte limit of the files API`, {
            path,
            size: st.size,
            limit: maxBytes,
          });
        }
        const buf = Buffer.alloc(st.size);
        let off = 0;
        while (off < st.size) {
          const n = readSync(fd, buf, off, st.size - off, off);
          if (n === 0) break;
          off += n;
        }
        return buf.subarray(0, off);
      } finally {
        closeSync(fd);
      }
    },
    user,
    'read',
  );
}

/**
 * Who owns what the files API creates, as host ids: unset, the edge's own (host root, which is
 * the sandbox's root without a user namespace); in a user-namespaced sandbox, its range's base,
 * so a file the trainer writes is the sandbox root's inside, not nobody's.
 */
export interface FileOwner {
  uid: number;
  gid: number;
}

/**
 * Writes (create or truncate) a file, creating missing parent directories, all inside the root.
 * `owner`: who the edge gives what it creates to (root's calls); `user`: who the call acts as
 * (what it creates is then the user's by the kernel's own rules, and the mode of an existing file
 * is changed only when the user owns it, as chmod(2) allows); `metadata`: the file's user xattrs
 * under a prefix, set after the bytes (file-metadata.ts).
 */
export function writeFileInRoot(
  rootfs: string,
  path: string,
  data: Buffer,
  mode: number,
  opts: { owner?: FileOwner | undefined; user?: ActingUser | undefined; metadata?: FileMetadataWrite | undefined } = {},
): number {
  const { owner, user } = opts;
  return withRoot(
    rootfs,
    (rootFd) => {
      const parts = path.split('/').filter((p) => p !== '' && p !== '.');
      if (parts.length === 0) throw new ApiError('PATH_CONFLICT', `${path} is the root directory`, { path });
      makeDirs(rootFd, parts.slice(0, -1), path, { parents: true, mode: 0o755, owner });
      let fd: number;
      let created = false;
      try {
        fd = openRegular(rootFd, path, fsc.O_WRONLY | fsc.O_TRUNC);
      } catch (err) {
        if (!(err instanceof ApiError && err.code === 'FILE_NOT_FOUND')) throw err;
        try {
          // O_EXCL: a new regular file, never an existing FIFO or device.
          fd = openat2(rootFd, path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | O_CLOEXEC, mode, RESOLVE);
          created = true;
        } catch (e) {
          if (!(e instanceof SyscallError && e.code === 'EEXIST')) mapError(e, path, rootfs);
          // A dangling symlink: create its target (resolved inside the root). O_NONBLOCK so a FIFO
          // raced in meanwhile fails (ENXIO) instead of blocking; the fstat below rejects non-files.
          try {
            fd = openat2(rootFd, path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC | fsc.O_NONBLOCK | O_CLOEXEC, mode, RESOLVE);
          } catch (e2) {
            mapError(e2, path, rootfs);
          }
          if (!fstatSync(fd).isFile()) {
            closeSync(fd);
            throw new ApiError('INVALID_REQUEST', `${path} is not a regular file`, { path });
          }
        }
      }
      try {
        if (created && owner) fchownSync(fd, owner.uid, owner.gid);
        if (created || !user || fstatSync(fd).uid === user.host.uid) fchmodSync(fd, mode);
        let off = 0;
        while (off < data.length) off += writeSync(fd, data, off, data.length - off);
        if (opts.metadata) writeMetadata(fd, path, opts.metadata);
        return data.length;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOSPC') throw noSpace(path, rootfs);
        mapError(err, path, rootfs);
      } finally {
        closeSync(fd);
      }
    },
    user,
    'write',
  );
}

function statToInfo(path: string, name: string, st: Stats, linkTarget?: string, metadata?: Record<string, string>): FileStat {
  const info: FileStat = {
    path,
    name,
    type: st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other',
    size: st.size,
    mode: (st.mode & 0o7777).toString(8).padStart(4, '0'),
    uid: st.uid,
    gid: st.gid,
    mtime: st.mtime.toISOString(),
  };
  if (linkTarget !== undefined) info.linkTarget = linkTarget;
  if (metadata !== undefined) info.metadata = metadata;
  return info;
}

/** Splits `/a/b/c` into the parent (`/a/b`) and the last component (`c`). */
export function splitParent(path: string): { parent: string; name: string } {
  const parts = path.split('/').filter((p) => p !== '' && p !== '.');
  const name = parts.pop();
  if (name === undefined || name === '..')
    throw new ApiError('INVALID_REQUEST', `${path} names no entry (the root, or ends in ..)`, { path });
  return { parent: `/${parts.join('/')}`, name };
}

/** Opens a directory inside the root as O_PATH; fn gets its fd. */
function withDir<T>(rootFd: number, path: string, fn: (dirFd: number) => T): T {
  let fd: number;
  try {
    fd = openat2(rootFd, path, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE);
  } catch (err) {
    mapError(err, path);
  }
  try {
    return fn(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * lstat of `p` and, for a link, its target. The sandbox can swap the entry between the two
 * calls: readlink then fails with EINVAL (a link that became a directory; the files race test
 * saw it answer 500), so both are taken again until they agree; an entry that keeps changing is
 * reported as such (EAGAIN: 409 PATH_CONFLICT, retry).
 */
function lstatWithTarget(p: string): { st: Stats; target: string | undefined } {
  for (let i = 0; i < 16; i++) {
    const st = lstatSync(p);
    if (!st.isSymbolicLink()) return { st, target: undefined };
    try {
      return { st, target: readlinkSync(p) };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EINVAL') throw err;
    }
  }
  throw Object.assign(new Error(`${p} kept changing between lstat and readlink`), { code: 'EAGAIN' });
}

/** What stat and list may be asked for beyond the entry: whom they act as, and its metadata under a prefix. */
export interface StatInRootOptions {
  user?: ActingUser | undefined;
  metadataPrefix?: string | undefined;
}

/** lstat of one entry: the parent is resolved inside the root, the entry itself is not followed. */
export function statInRoot(rootfs: string, path: string, opts: StatInRootOptions = {}): FileStat {
  return withRoot(
    rootfs,
    (rootFd) => {
      const { parent, name } = splitParent(path);
      return withDir(rootFd, parent, (dirFd) => {
        const p = `/proc/self/fd/${dirFd}/${name}`;
        try {
          const { st, target } = lstatWithTarget(p);
          return statToInfo(path, name, st, target, opts.metadataPrefix === undefined ? undefined : readMetadata(p, opts.metadataPrefix));
        } catch (err) {
          mapError(err, path);
        }
      });
    },
    opts.user,
    'stat',
  );
}

/** Lists a directory (entries lstat'ed, links not followed). */
export function listDirInRoot(
  rootfs: string,
  path: string,
  opts: StatInRootOptions & { limit?: number } = {},
): { entries: FileStat[]; truncated: boolean } {
  const limit = opts.limit ?? 10_000;
  return withRoot(
    rootfs,
    (rootFd) =>
      withDir(rootFd, path, (dirFd) => {
        const dir = `/proc/self/fd/${dirFd}`;
        let names: string[];
        try {
          names = readdirSync(dir).sort();
        } catch (err) {
          mapError(err, path);
        }
        const entries: FileStat[] = [];
        for (const name of names.slice(0, limit)) {
          const entryPath = `${path.replace(/\/$/, '')}/${name}`;
          try {
            const { st, target } = lstatWithTarget(`${dir}/${name}`);
            const metadata = opts.metadataPrefix === undefined ? undefined : readMetadata(`${dir}/${name}`, opts.metadataPrefix);
            entries.push(statToInfo(entryPath, name, st, target, metadata));
          } catch (err) {
            // Removed while listing: it is not there. Anything else (an entry that kept changing)
            // is said, not left out of a listing that would then look whole.
            if ((err as NodeJS.ErrnoException).code !== 'ENOENT') mapError(err, entryPath);
          }
        }
        return { entries, truncated: names.length > limit };
      }),
    opts.user,
    'list',
  );
}

/**
 * Creates the directories `parts` (a path from the root, component by component), each opened
 * and created inside the root. Without `parents`, every component but the last must exist and
 * the last must not.
 */
function makeDirs(
  rootFd: number,
  parts: string[],
  path: string,
  opts: { parents: boolean; mode: number; owner?: FileOwner | undefined },
): void {
  let dir = '';
  for (const [i, part] of parts.entries()) {
    const last = i === parts.length - 1;
    const next = `${dir}/${part}`;
    let exists = true;
    try {
      closeSync(openat2(rootFd, next, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE));
    } catch (err) {
      if (!(err instanceof SyscallError && err.code === 'ENOENT')) mapError(err, path);
      exists = false;
    }
    if (exists && last && !opts.parents) throw new ApiError('PATH_CONFLICT', `${path} already exists`, { path });
    if (!exists) {
      if (!last && !opts.parents) throw new ApiError('FILE_NOT_FOUND', `parent of ${path} does not exist (set parents: true)`, { path });
      withDir(rootFd, dir || '/', (parentFd) => {
        try {
          mkdirat(parentFd, part, opts.mode);
        } catch (e) {
          if (!(e instanceof SyscallError && e.code === 'EEXIST')) mapError(e, path);
        }
      });
      if (opts.owner) chownDirInRoot(rootFd, next, path, opts.owner);
    }
    dir = next;
  }
}

/** Gives a directory just made to `owner`, opened inside the root (a swapped-in symlink resolves inside too). */
function chownDirInRoot(rootFd: number, dir: string, path: string, owner: FileOwner): void {
  let fd: number;
  try {
    fd = openat2(rootFd, dir, fsc.O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE);
  } catch (err) {
    mapError(err, path);
  }
  try {
    fchownSync(fd, owner.uid, owner.gid);
  } finally {
    closeSync(fd);
  }
}

/** mkdir, optionally with parents (like mkdir -p); as `owner` gives them, or as `user` makes them. */
export function mkdirInRoot(
  rootfs: string,
  path: string,
  parents: boolean,
  opts: { mode?: number; owner?: FileOwner | undefined; user?: ActingUser | undefined } = {},
): void {
  withRoot(
    rootfs,
    (rootFd) =>
      makeDirs(
        rootFd,
        path.split('/').filter((p) => p !== '' && p !== '.'),
        path,
        { parents, mode: opts.mode ?? 0o755, owner: opts.owner },
      ),
    opts.user,
    'create',
  );
}

/** lstat of `name` in an open directory; ENOENT is FILE_NOT_FOUND, anything else the path's error. */
export function lstatIn(dirFd: number, name: string, path: string): Stats {
  try {
    return lstatSync(`/proc/self/fd/${dirFd}/${name}`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT')
      throw new ApiError('FILE_NOT_FOUND', `no such file in the sandbox: ${path}`, { path });
    mapError(err, path);
  }
}

/** Removes a file, a symlink (not its target) or an empty directory. */
export function removeInRoot(rootfs: string, path: string, user?: ActingUser): void {
  withRoot(
    rootfs,
    (rootFd) => {
      const { parent, name } = splitParent(path);
      withDir(rootFd, parent, (dirFd) => {
        const st = lstatIn(dirFd, name, path);
        try {
          unlinkat(dirFd, name, st.isDirectory() ? AT_REMOVEDIR : 0);
        } catch (err) {
          if (err instanceof SyscallError && (err.code === 'ENOTEMPTY' || err.code === 'EEXIST')) {
            throw new ApiError('PATH_CONFLICT', `${path} is a directory that is not empty (set recursive: true)`, { path });
          }
          mapError(err, path);
        }
      });
    },
    user,
    'remove',
  );
}

/** Renames within the sandbox; both parents are resolved inside the root. */
export function renameInRoot(rootfs: string, from: string, to: string, user?: ActingUser): void {
  withRoot(
    rootfs,
    (rootFd) => {
      const a = splitParent(from);
      const b = splitParent(to);
      withDir(rootFd, a.parent, (fromFd) =>
        withDir(rootFd, b.parent, (toFd) => {
          try {
            renameat(fromFd, a.name, toFd, b.name);
          } catch (err) {
            mapError(err, from);
          }
        }),
      );
    },
    user,
    'rename',
  );
}

/** Whether `path` is a regular file inside the sandbox (symlinks resolved inside its root, never on the host). */
export function isRegularFileInRoot(rootfs: string, path: string): boolean {
  try {
    return withRoot(rootfs, (rootFd) => {
      const fd = openat2(rootFd, path, O_PATH | O_CLOEXEC, 0, RESOLVE);
      try {
        return fstatSync(fd).isFile();
      } finally {
        closeSync(fd);
      }
    });
  } catch {
    return false;
  }
}
