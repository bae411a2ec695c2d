import { posix } from 'node:path';
import { ApiError } from '../../../api-error.js';

/** Paths that inside the sandbox are kernel filesystems, not files of its root. */
const VIRTUAL = /^\/(proc|sys|dev)(\/|$)/;

/** Normalises an API path: relative paths are taken from `cwd`; the result is absolute. */
export function sandboxPath(path: string, cwd: string): string {
  if (path.includes('\0')) throw new ApiError('INVALID_REQUEST', 'path must not contain NUL bytes', { path });
  const abs = path.startsWith('/') ? path : `${cwd.replace(/\/$/, '')}/${path}`;
  // The check sees the normalised path (so /tmp/../proc is caught); the kernel gets the path as
  // given, since `..` after a symlink means something else than lexically.
  if (VIRTUAL.test(posix.normalize(abs))) {
    throw new ApiError('INVALID_REQUEST', `path ${path} is in /proc, /sys or /dev, which the files API does not serve; read it with exec`, {
      path,
    });
  }
  return abs;
}
