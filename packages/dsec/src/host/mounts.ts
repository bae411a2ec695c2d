import { readFileSync } from 'node:fs';

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
    if ((path === m.mountPoint || path.startsWith(mp) || m.mountPoint === '/') && (!best || m.mountPoint.length >= best.mountPoint.length)) {
      best = m;
    }
  }
  return best?.fsType ?? 'unknown';
}
