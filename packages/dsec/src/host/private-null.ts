import { chmodSync, chownSync, existsSync, lstatSync, openSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

/** The null device's numbers (Linux: char 1:3). */
const NULL_RDEV = { major: 1, minor: 3 };

/** dsec's own null device node: what crun gets as stdio instead of the host's /dev/null. */
export const PRIVATE_NULL = '/dev/.dsec-null';

function isNullDevice(path: string): boolean {
  try {
    const st = lstatSync(path);
    // rdev = major << 8 | minor for the small numbers of the null device.
    return st.isCharacterDevice() && st.rdev === ((NULL_RDEV.major << 8) | NULL_RDEV.minor);
  } catch {
    return false;
  }
}

/**
 * A second node of the null device, for the stdio of the tools dsec starts (crun above all).
 * Why: crun (Debian's 1.8.1; fixed upstream in 1.23) chowns its stdio to the container's root when
 * the container has a user namespace, and a `crun run` given the host's /dev/null made that
 * device owned by the new sandbox's root, so root in that sandbox (whose /dev/null is a bind of
 * the host's) could chmod the host's /dev/null. With this node as stdio crun chowns only it; it is
 * never bound into a sandbox. Made at the edge's start (mknod, as root); undefined, with why, where
 * it cannot be made (a /dev mounted nodev, no CAP_MKNOD): crun then gets /dev/null as before.
 */
export function ensurePrivateNull(): { path: string } | { path: undefined; why: string } {
  if (isNullDevice(PRIVATE_NULL)) return { path: PRIVATE_NULL };
  if (existsSync(PRIVATE_NULL)) return { path: undefined, why: `${PRIVATE_NULL} exists and is not the null device` };
  // Once per edge start: a blocking mknod(1) is simpler than a binding of mknod(2).
  const r = spawnSync('mknod', ['-m', '0666', PRIVATE_NULL, 'c', String(NULL_RDEV.major), String(NULL_RDEV.minor)], { encoding: 'utf8' });
  if (r.status !== 0 || !isNullDevice(PRIVATE_NULL))
    return { path: undefined, why: `mknod ${PRIVATE_NULL}: ${(r.stderr ?? '').trim() || `exit ${r.status}`}` };
  return { path: PRIVATE_NULL };
}

/** The private node for a helper's "null" stdio (SpawnHelper's default), or undefined where it cannot be had. */
export function defaultNullDevice(): string | undefined {
  if (process.getuid?.() === 0) return ensurePrivateNull().path;
  return isNullDevice(PRIVATE_NULL) ? PRIVATE_NULL : undefined;
}

/** The fd of nullStdio(): undefined until asked for, null where the node cannot be had. */
let nullFd: number | null | undefined;

/**
 * What a tool this process spawns itself gets for a stdio it does not use, instead of Node's
 * 'ignore' (which opens the host's /dev/null): an fd on dsec's own null node, opened once and kept
 * for the process's life (Node opens it close-on-exec; spawn dups it onto the child's 0, 1 or 2).
 * For the same reason as ensurePrivateNull: a `crun run` or `crun exec` of a user-namespaced
 * container spawned with the host's /dev/null chowned it to that container's root (the bench's raw
 * crun peers, an edge without its dsec-spawn). 'ignore' where the node cannot be made.
 */
export function nullStdio(): number | 'ignore' {
  if (nullFd === undefined) {
    const path = defaultNullDevice();
    try {
      nullFd = path ? openSync(path, 'r+') : null;
    } catch {
      nullFd = null;
    }
  }
  return nullFd ?? 'ignore';
}

/**
 * The host's /dev/null as it must be: root's, mode 0666. A crun that chowned it (see
 * ensurePrivateNull) left it owned by a sandbox's root; this gives it back.
 */
export function restoreHostNull(): { ok: boolean; detail: string; fixed?: string } {
  let st;
  try {
    st = lstatSync('/dev/null');
  } catch (err) {
    return { ok: false, detail: `cannot stat /dev/null: ${(err as Error).message}` };
  }
  const mode = st.mode & 0o7777;
  if (st.uid === 0 && st.gid === 0 && mode === 0o666) return { ok: true, detail: 'root:root 0666' };
  const was = `${st.uid}:${st.gid} ${mode.toString(8)}`;
  try {
    chownSync('/dev/null', 0, 0);
    chmodSync('/dev/null', 0o666);
  } catch (err) {
    return { ok: false, detail: `/dev/null is ${was}, and could not be given back to root: ${(err as Error).message}` };
  }
  return {
    ok: true,
    detail: 'root:root 0666',
    fixed: `/dev/null was ${was} (a sandbox's root owned the host's null device); now root:root 0666`,
  };
}
