import { type Stats, chmodSync, lchownSync, lstatSync, lutimesSync, readdirSync, renameSync, rmSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { getXattr, listXattrs, setXattr } from '../../host/syscalls.js';
import { OPAQUE_XATTR, isWhiteoutStat, lstatOrUndefined, removeXattr } from './safe-extract.js';

/**
 * Squashing: applies a layer tree in overlayfs form (whiteouts as char 0:0, opaque dirs marked
 * with trusted.overlay.opaque) onto a plain tree, as overlayfs would show the two stacked: a
 * whiteout deletes, an opaque or replacing directory replaces, other directories merge, any other
 * entry replaces. Entries are moved (renamed), not copied, so `upper` is consumed; hard-link
 * groups stay groups. The result holds no whiteouts and no opaque markers.
 */
export function mergeLayerInto(lower: string, upper: string): void {
  const walk = (rel: string): void => {
    for (const name of readdirSync(join(upper, rel))) {
      const childRel = rel ? `${rel}/${name}` : name;
      const u = join(upper, childRel);
      const l = join(lower, childRel);
      const ust = lstatSync(u);
      const lst = lstatOrUndefined(l);
      if (isWhiteoutStat(ust)) {
        if (lst) rmSync(l, { recursive: true, force: true });
        continue;
      }
      if (ust.isDirectory() && lst?.isDirectory() && !listXattrs(u).includes(OPAQUE_XATTR)) {
        walk(childRel);
        copyDirMeta(u, l, ust);
        continue;
      }
      if (lst) rmSync(l, { recursive: true, force: true });
      renameSync(u, l);
      if (ust.isDirectory()) stripOverlayMarks(l);
    }
  };
  walk('');
  const rootSt = lstatSync(upper);
  copyDirMeta(upper, lower, rootSt);
}

function copyDirMeta(from: string, to: string, st: Stats): void {
  for (const name of listXattrs(from)) if (name !== OPAQUE_XATTR) setXattr(to, name, getXattr(from, name));
  lchownSync(to, st.uid, st.gid);
  chmodSync(to, st.mode & 0o7777);
  lutimesSync(to, st.atime, st.mtime);
}

/** Inside a directory that replaced a lower one, whiteouts and opaque marks mean nothing: drop them. */
export function stripOverlayMarks(dir: string): void {
  const st = lstatSync(dir);
  if (listXattrs(dir).includes(OPAQUE_XATTR)) removeXattr(dir, OPAQUE_XATTR);
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    const cst = lstatSync(p);
    if (isWhiteoutStat(cst)) unlinkSync(p);
    else if (cst.isDirectory()) stripOverlayMarks(p);
  }
  lutimesSync(dir, st.atime, st.mtime);
}
