import { closeSync, constants, openSync, readFileSync } from 'node:fs';
import { dirname } from 'node:path';

export interface MountEntry {
  mountPoint: string;
  fsType: string;
  source: string;
  /** Per-mount options (rw/ro, nosuid, nodev, noexec, …), the sixth field of mountinfo. */
  options: string[];
}

/** mountinfo escapes space, tab, newline and backslash as octal (\040 …). */
function unescapeOctal(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Current mounts of this process's mount namespace, in mount order. */
export function readMounts(): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    if (!line) continue;
    const [pre, post] = line.split(' - ');
    const fields = pre?.split(' ') ?? [];
    const postFields = post?.split(' ') ?? [];
    const mountPoint = fields[4];
    if (mountPoint === undefined) continue;
    out.push({
      mountPoint: unescapeOctal(mountPoint),
      fsType: postFields[0] ?? '',
      source: unescapeOctal(postFields[1] ?? ''),
      options: (fields[5] ?? '').split(','),
    });
  }
  return out;
}

/** Mounts at or below `dir` (deepest last, so unmount in reverse). */
export function mountsUnder(dir: string): MountEntry[] {
  const prefix = dir.endsWith('/') ? dir : `${dir}/`;
  return readMounts().filter((m) => m.mountPoint === dir || m.mountPoint.startsWith(prefix));
}

/** The filesystem type that holds `path` (the longest mount point prefix). */
export function filesystemOf(path: string): string {
  let best: MountEntry | undefined;
  for (const m of readMounts()) {
    const mp = m.mountPoint.endsWith('/') ? m.mountPoint : `${m.mountPoint}/`;
    if (
      (path === m.mountPoint || path.startsWith(mp) || m.mountPoint === '/') &&
      (!best || m.mountPoint.length >= best.mountPoint.length)
    ) {
      best = m;
    }
  }
  return best?.fsType ?? 'unknown';
}

/** O_PATH (linux/fcntl.h): an fd naming a file without opening it, so its filesystem is not touched. */
const O_PATH = 0o10000000;

/**
 * The id of the mount `path` is on (mnt_id in its fd's fdinfo), or undefined when it does not
 * exist. The final component is not followed (a link is its own entry) and, with O_PATH, its
 * filesystem is not asked for anything: a dead FUSE layer under an overlay does not hang it.
 */
export function mountIdOf(path: string): number | undefined {
  let fd: number;
  try {
    fd = openSync(path, O_PATH | constants.O_NOFOLLOW);
  } catch {
    return undefined;
  }
  try {
    return Number(/^mnt_id:\s*(\d+)/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))?.[1]);
  } finally {
    closeSync(fd);
  }
}

/**
 * Whether something is mounted at `path` in this mount namespace: its mount differs from its
 * parent directory's. Two small reads, where mountsUnder reads the whole mount table, which on a
 * node holding thousands of sandboxes is thousands of lines, every one an overlay's options.
 */
export function isMountPoint(path: string): boolean {
  const own = mountIdOf(path);
  return own !== undefined && own !== mountIdOf(dirname(path));
}
