import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { isMountPoint } from '../../../host/mounts.js';
import { tryUnmount } from '../../node/layer-mounts.js';

/**
 * Unmounts what the edge mounted in a sandbox's directory, found from the directory's layout
 * rather than the mount table: the edge mounts only its direct entries (the overlay at
 * `rootfs`, the size-limited upper at `disk`, the user namespace bound at `userns`) and the
 * id-mapped volumes at `volumes/<i>`. Each is unmounted until nothing is left there (a crash and
 * a retry can stack two), a busy one detached. Volumes first, the disk last: it holds the
 * overlay's upper. Works on a half-made sandbox too; needs no record.
 *
 * Reading /proc/self/mountinfo instead (mountsUnder) costs a line per mount on the node, an
 * overlay's long options each: on a node holding 5,000 sandboxes it was most of a kill's time
 * and blocked the edge's event loop meanwhile (docs/RELIABILITY.md, "A full node").
 *
 * Returns the mount points still there (none, normally): the caller must not remove the tree then.
 */
export function unmountSandboxDir(dir: string): string[] {
  const entries = (d: string): string[] => {
    try {
      return readdirSync(d, { withFileTypes: true })
        .filter((e) => e.isDirectory() || e.isFile())
        .map((e) => join(d, e.name));
    } catch {
      return []; // not there (a half-made sandbox)
    }
  };
  const top = entries(dir).filter((p) => !p.endsWith('/volumes') && !p.endsWith('/disk'));
  const candidates = [...entries(join(dir, 'volumes')), ...top, join(dir, 'disk')];
  for (const mp of candidates) {
    for (let i = 0; i < 8 && isMountPoint(mp); i++) tryUnmount(mp);
  }
  return candidates.filter(isMountPoint);
}
