import { ApiError } from '../../../api-error.js';
import { SyscallError, getXattr, listXattrs, listXattrsOf, removeXattrOf, setXattrOf } from '../../../host/syscalls.js';
import type { FileMetadataWrite } from '../../protocol/file-options.js';

/**
 * File metadata as user extended attributes (`user.*`), read and written by the calling thread, so
 * a call acting as a user (host/fs-ids.ts) is checked as that user: setting or removing one needs
 * write permission on the file, reading one needs read permission (xattr(7)).
 */

/** A failed xattr call as the caller's error; the path is the sandbox's. */
function xattrError(err: unknown, path: string): never {
  const code = err instanceof SyscallError ? err.code : undefined;
  switch (code) {
    case 'ENOTSUP':
      throw new ApiError('INVALID_REQUEST', `the filesystem under ${path} does not keep extended attributes (metadata)`, { path });
    case 'EACCES':
    case 'EPERM':
      throw new ApiError('FILE_PERMISSION_DENIED', `permission denied: ${path}`, { path });
    case 'ERANGE':
      throw new ApiError('INVALID_REQUEST', `a metadata name of ${path} is longer than 255 bytes, or a value longer than 64 KiB`, { path });
    case 'E2BIG':
      throw new ApiError('INVALID_REQUEST', `a metadata value of ${path} is longer than 64 KiB`, { path });
    case 'ENOSPC':
      throw new ApiError('PAYLOAD_TOO_LARGE', `the metadata of ${path} is more than its filesystem keeps for one file`, { path });
  }
  throw err;
}

/**
 * Leaves exactly `m.values` under `m.prefix` on the open file: the other attributes under the prefix
 * are removed first (an overwrite without values clears the earlier set), then each is set.
 */
export function writeMetadata(fd: number, path: string, m: FileMetadataWrite): void {
  try {
    for (const name of listXattrsOf(fd)) {
      if (!name.startsWith(m.prefix) || Object.hasOwn(m.values, name.slice(m.prefix.length))) continue;
      try {
        removeXattrOf(fd, name);
      } catch (err) {
        if (!(err instanceof SyscallError && err.code === 'ENODATA')) throw err; // removed meanwhile
      }
    }
    for (const [key, value] of Object.entries(m.values)) setXattrOf(fd, m.prefix + key, Buffer.from(value, 'utf8'));
  } catch (err) {
    xattrError(err, path);
  }
}

/**
 * The attributes of `entry` (a path not followed if it is a symlink: l*xattr) named `prefix…`,
 * keyed without the prefix, values as utf-8; undefined when it has none. Attributes the caller may
 * not read, and filesystems that keep none, give none: a listing is not failed for one entry.
 */
export function readMetadata(entry: string, prefix: string): Record<string, string> | undefined {
  let names: string[];
  try {
    names = listXattrs(entry).filter((n) => n.startsWith(prefix));
  } catch (err) {
    if (err instanceof SyscallError && ['ENOTSUP', 'EACCES', 'EPERM'].includes(err.code)) return undefined;
    throw err;
  }
  const out: Record<string, string> = {};
  let any = false;
  for (const name of names) {
    try {
      out[name.slice(prefix.length)] = getXattr(entry, name).toString('utf8');
      any = true;
    } catch (err) {
      if (!(err instanceof SyscallError && ['ENODATA', 'EACCES', 'EPERM', 'ENOTSUP'].includes(err.code))) throw err;
    }
  }
  return any ? out : undefined;
}
