import { type Dir, closeSync, opendirSync, constants as fsc } from 'node:fs';
import { ApiError } from '../../../api-error.js';
import { withFsIds } from '../../../host/fs-ids.js';
import {
  AT_REMOVEDIR,
  O_CLOEXEC,
  O_DIRECTORY,
  O_NOFOLLOW,
  O_PATH,
  RESOLVE_BENEATH,
  RESOLVE_NO_SYMLINKS,
  RESOLVE_NO_XDEV,
  SyscallError,
  openat2,
  unlinkat,
} from '../../../host/syscalls.js';
import { type ActingUser, RESOLVE, lstatIn, mapError, permissionWorded, splitParent, withRoot } from './sandbox-files.js';

/*
 * A user's recursive remove inside a sandbox's root (E2B's Remove as `user`): a walk of its own,
 * beside the single-entry calls of sandbox-files.ts, because it is the one file call whose work
 * the sandbox sizes (a tree of any number of entries) and so goes in slices between which the
 * edge's event loop runs.
 */

/** Entries a user's recursive remove handles per turn of the edge's event loop. */
const REMOVE_SLICE = 2000;

/** A directory a recursive remove is emptying: its fd, its reader, and where it sits. */
interface RemoveFrame {
  fd: number;
  dir: Dir;
  path: string;
  parentFd: number;
  name: string;
}

/**
 * Removes a directory and everything in it as `user`, walking it in the edge: each directory is
 * opened beneath its parent's fd (never through a symlink, never across a mount), read and
 * emptied with unlinkat(2) under the user's ids, so the kernel refuses what the user may not
 * remove. The first refusal ends the walk (FILE_PERMISSION_DENIED naming the entry) with what came
 * before it removed, as `rm -r` leaves a tree it could not finish. The walk goes REMOVE_SLICE
 * entries at a time (each slice synchronous, under the user's ids), yielding the event loop in
 * between: the sandbox decides how many entries there are, and 200,000 of them held the loop of
 * the control plane (in-process edges) 3.7 s. Root's recursive removes run the sandbox's rm
 * instead (exec/sandbox-tar.ts), out of the edge's event loop.
 */
export async function removeTreeInRoot(rootfs: string, path: string, user: ActingUser): Promise<void> {
  const { parent, name } = splitParent(path);
  const stack: RemoveFrame[] = [];
  let parentFd: number | undefined;
  const slice = (fn: () => void): void => {
    try {
      withFsIds(user.host, fn);
    } catch (err) {
      permissionWorded(err, user, 'remove');
    }
  };
  try {
    // The root is opened as the edge (the sandboxes' dir is root's), the parent below it as the user.
    const pfd = withRoot(
      rootfs,
      (rootFd) => {
        try {
          return openat2(rootFd, parent, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE);
        } catch (err) {
          mapError(err, parent);
        }
      },
      user,
      'remove',
    );
    parentFd = pfd;
    slice(() => enterEntry(stack, pfd, name, path.replace(/\/+$/, '')));
    while (stack.length > 0) {
      await new Promise((r) => setImmediate(r));
      slice(() => {
        for (let n = 0; n < REMOVE_SLICE && stack.length > 0; n++) {
          const top = stack[stack.length - 1]!;
          const ent = top.dir.readSync();
          if (ent !== null) {
            try {
              enterEntry(stack, top.fd, ent.name, `${top.path}/${ent.name}`);
            } catch (err) {
              if (!(err instanceof ApiError && err.code === 'FILE_NOT_FOUND')) throw err; // gone meanwhile
            }
            continue;
          }
          stack.pop();
          closeFrame(top);
          unlinkEntry(top.parentFd, top.name, top.path, true);
        }
      });
    }
  } finally {
    for (const f of stack) closeFrame(f);
    if (parentFd !== undefined) closeSync(parentFd);
  }
}

function closeFrame(f: RemoveFrame): void {
  try {
    f.dir.closeSync();
  } finally {
    closeSync(f.fd);
  }
}

/** A directory entry met by the walk: a directory is opened and pushed to be emptied, anything else unlinked. */
function enterEntry(stack: RemoveFrame[], parentFd: number, name: string, path: string): void {
  const st = lstatIn(parentFd, name, path);
  if (!st.isDirectory()) {
    unlinkEntry(parentFd, name, path, false);
    return;
  }
  let fd: number;
  try {
    fd = openat2(
      parentFd,
      name,
      fsc.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
      0,
      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV,
    );
  } catch (err) {
    mapError(err, path);
  }
  let dir: Dir;
  try {
    dir = opendirSync(`/proc/self/fd/${fd}`);
  } catch (err) {
    closeSync(fd);
    mapError(err, path);
  }
  stack.push({ fd, dir, path, parentFd, name });
}

function unlinkEntry(parentFd: number, name: string, path: string, isDir: boolean): void {
  try {
    unlinkat(parentFd, name, isDir ? AT_REMOVEDIR : 0);
  } catch (err) {
    if (err instanceof SyscallError && err.code === 'ENOTEMPTY') {
      throw new ApiError('PATH_CONFLICT', `${path} gained entries while it was being removed; retry`, { path });
    }
    if (!(err instanceof SyscallError && err.code === 'ENOENT')) mapError(err, path);
  }
}
