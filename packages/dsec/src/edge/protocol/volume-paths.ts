import { posix } from 'node:path';

/** Where a volume may not be mounted: the kernel's views, which the sandbox's own mounts cover. */
const RESERVED = ['/proc', '/sys', '/dev'];

/**
 * Why these volume mounts cannot be made (the first problem, saying what to fix), or undefined.
 * Checked by the control plane (a 400 before placement) and again by the edge that mounts them.
 */
export function volumeMountsError(mounts: readonly { name: string; path: string }[]): string | undefined {
  const seenPaths = new Set<string>();
  const seenNames = new Set<string>();
  for (const m of mounts) {
    const p = m.path;
    if (!p.startsWith('/') || posix.normalize(p) !== p || p.endsWith('/') || p.includes('\0')) {
      return `volume ${m.name}: path ${JSON.stringify(p)} must be absolute and normalised (no //, ., .. or trailing /)`;
    }
    if (p === '/') return `volume ${m.name}: it cannot be mounted over / (pick a directory such as /data)`;
    const reserved = RESERVED.find((r) => p === r || p.startsWith(`${r}/`));
    if (reserved) return `volume ${m.name}: ${p} is under ${reserved}, which the sandbox's own ${reserved} covers; pick another path`;
    if (seenPaths.has(p)) return `two volumes are mounted at ${p}`;
    if (seenNames.has(m.name)) return `volume ${m.name} is listed twice`;
    seenPaths.add(p);
    seenNames.add(m.name);
  }
  return undefined;
}
