import { chownSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { IDMAP_BINARY } from '../../../host/native-helpers.js';
import { attachMount, cloneTree, idmapClone } from '../../../host/mount-api.js';
import { ToolError, runToolOrThrow } from '../../../host/run-tool.js';
import type { SpawnHelper } from '../../../host/spawn-helper.js';
import type { UidRange } from '../../../host/uid-ranges.js';
import { mountOverlay } from './overlay.js';

/**
 * Makes a user namespace owned by `range` and binds it on `file` (created here, 0400), for crun to
 * join and for mountIdmappedRoot to id-map with. dsec-idmap (native/idmap-mount.c) makes it: it
 * must be made by a process that first becomes the range's base uid, so the namespace is owned by
 * it, not root. Started by the edge's dsec-spawn (`spawner`), not by a fork of the edge's large
 * process. Used on a create's path, and ahead of creates by edge/userns-pool.ts.
 */
export async function makeUserns(range: UidRange, file: string, spawner: SpawnHelper | undefined): Promise<void> {
  closeSync(openSync(file, 'w', 0o400)); // a file for the namespace to be bound on
  const args = ['--map', `${range.base}:${range.size}`, '--userns-file', file];
  if (spawner) {
    const r = await spawner.run(IDMAP_BINARY, args, { stdio: 'pipe' });
    if (r.code !== 0) throw new ToolError(IDMAP_BINARY, args, r);
  } else {
    await runToolOrThrow(IDMAP_BINARY, args);
  }
}

/**
 * The root of a sandbox that runs in a user namespace (edge option `userns`, the default), whose
 * namespace is already bound on `usernsFile` (by makeUserns, or taken from the edge's pool of
 * namespaces made ahead). Done here, in-process (host/mount-api.ts): the
 * overlay at `target` over id-mapped clones of the shared layers, so files of host uid 0 in a
 * layer are the sandbox's root inside, handed to overlayfs as file descriptors (no layer mount of
 * its own appears anywhere, nor a host path in the overlay's options); and each volume id-mapped
 * at its `dest`, where crun binds it from. The upper dir is owned by the range's base: it is the
 * sandbox's `/`.
 */
export function mountIdmappedRoot(o: {
  lowersBottomFirst: string[];
  upper: string;
  work: string;
  target: string;
  range: UidRange;
  usernsFile: string;
  volumes: { source: string; dest: string }[];
}): void {
  for (const d of [o.upper, o.work, o.target]) mkdirSync(d, { recursive: true });
  chownSync(o.upper, o.range.base, o.range.base);
  for (const v of o.volumes) mkdirSync(v.dest, { recursive: true });
  const userns = openSync(o.usernsFile, 'r'); // an nsfs file: its fd is the namespace (Node opens fds close-on-exec)
  try {
    // Volumes first: a failure later leaves only what the caller's teardown of its dir removes.
    for (const v of o.volumes) {
      const fd = cloneTree(v.source, true);
      try {
        idmapClone(fd, userns, true, v.source);
        attachMount(fd, v.dest);
      } finally {
        closeSync(fd);
      }
    }
    mountOverlay(o.lowersBottomFirst, o.upper, o.work, o.target, userns);
  } finally {
    closeSync(userns);
  }
}
