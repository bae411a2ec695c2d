import { closeSync, fstatSync, openSync, readSync, writeSync, fchmodSync, constants as fsc } from 'node:fs';
import { ApiError } from '../api-error.js';
import {
  O_CLOEXEC, O_DIRECTORY, O_PATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_XDEV, SyscallError, mkdirat, openat2,
} from '../host/syscalls.js';

/**
 * File access inside a sandbox's root from the host, through openat2(2) with RESOLVE_IN_ROOT:
 * the kernel resolves every component (`..`, absolute symlinks, symlinks swapped in between check
 * and use) as if the sandbox root were `/`, so no path from the API can reach a host file.
 * RESOLVE_NO_XDEV refuses to cross into any mount below the root.
 */
const RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/** Paths that inside the sandbox are kernel filesystems, not files of its root. */
const VIRTUAL = /^\/(proc|sys|dev)(\/|$)/;

/** Normalises an API path: relative paths are taken from `cwd`; the result is absolute. */
export function sandboxPath(path: string, cwd: string): string {
  if (path.includes('\0')) throw new ApiError('INVALID_REQUEST', 'path must not contain NUL bytes', { path });
  const abs = path.startsWith('/') ? path : `${cwd.replace(/\/$/, '')}/${path}`;
  if (VIRTUAL.test(abs.replace(/\/+/g, '/'))) {
    throw new ApiError('INVALID_REQUEST', `path ${path} is in /proc, /sys or /dev, which the files API does not serve; read it with exec`, { path });
  }
  return abs;
}

function withRoot<T>(rootfs: string, fn: (rootFd: number) => T): T {
  const rootFd = openSync(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
  try {
    return fn(rootFd);
  } finally {
    closeSync(rootFd);
  }
}

function mapError(err: unknown, path: string): never {
  if (err instanceof SyscallError) {
    switch (err.code) {
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
      case 'ENOSPC':
        throw new ApiError('PAYLOAD_TOO_LARGE', `the sandbox disk is full writing ${path}`, { path });
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
    return openSync(`/proc/self/fd/${pathFd}`, flags | O_CLOEXEC);
  } finally {
    closeSync(pathFd);
  }
}

export function readFileInRoot(rootfs: string, path: string, maxBytes: number): Buffer {
  return withRoot(rootfs, (rootFd) => {
    const fd = openRegular(rootFd, path, fsc.O_RDONLY);
    try {
      const st = fstatSync(fd);
      if (st.size > maxBytes) {
        throw new ApiError('PAYLOAD_TOO_LARGE', `${path} is ${st.size} bytes, over the ${maxBytes}-byte limit of the files API`, { path, size: st.size, limit: maxBytes });
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
  });
}

/** Writes (create or truncate) a file, creating missing parent directories, all inside the root. */
export function writeFileInRoot(rootfs: string, path: string, data: Buffer, mode: number): number {
  return withRoot(rootfs, (rootFd) => {
    const parts = path.split('/').filter((p) => p !== '' && p !== '.');
    if (parts.length === 0) throw new ApiError('PATH_CONFLICT', `${path} is the root directory`, { path });
    // Create parents one component at a time, each opened inside the root.
    let dir = '';
    for (const part of parts.slice(0, -1)) {
      const next = `${dir}/${part}`;
      try {
        closeSync(openat2(rootFd, next, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE));
      } catch (err) {
        if (!(err instanceof SyscallError && err.code === 'ENOENT')) mapError(err, path);
        let parentFd: number;
        try {
          parentFd = openat2(rootFd, dir || '/', O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE);
        } catch (e) {
          mapError(e, path);
        }
        try {
          mkdirat(parentFd, part, 0o755);
        } catch (e) {
          if (!(e instanceof SyscallError && e.code === 'EEXIST')) mapError(e, path);
        } finally {
          closeSync(parentFd);
        }
      }
      dir = next;
    }
    let fd: number;
    try {
      fd = openRegular(rootFd, path, fsc.O_WRONLY | fsc.O_TRUNC);
    } catch (err) {
      if (!(err instanceof ApiError && err.code === 'FILE_NOT_FOUND')) throw err;
      try {
        // O_EXCL: a new regular file, or EEXIST if the sandbox raced one in (the caller retries).
        fd = openat2(rootFd, path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | O_CLOEXEC, mode, RESOLVE);
      } catch (e) {
        mapError(e, path);
      }
    }
    try {
      fchmodSync(fd, mode);
      let off = 0;
      while (off < data.length) off += writeSync(fd, data, off, data.length - off);
      return data.length;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOSPC') throw new ApiError('PAYLOAD_TOO_LARGE', `the sandbox disk is full writing ${path}`, { path });
      throw err;
    } finally {
      closeSync(fd);
    }
  });
}
