import { chownSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { IDMAP_BINARY } from '../host/native-helpers.js';
import { attachMount, cloneTree, idmapClone } from '../host/mount-api.js';
import { ToolError, runToolOrThrow } from '../host/run-tool.js';
import type { SpawnHelper } from '../host/spawn-helper.js';
import type { UidRange } from '../host/uid-ranges.js';
import { mountOverlay } from './overlay.js';

/**
 * The root of a sandbox that runs in a user namespace (edge option `userns`, the default). The
 * namespace is made by dsec-idmap (native/idmap-mount.c: it must be made by a process that first
 * becomes the range's base uid, so the namespace is owned by it, not root) and bound on
 * `usernsFile` for crun to join. The rest is done here, in-process (host/mount-api.ts): the
 * overlay at `target` over id-mapped clones of the shared layers, so files of host uid 0 in a
 * layer are the sandbox's root inside, handed to overlayfs as file descriptors (no layer mount of
 * its own appears anywhere, nor a host path in the overlay's options); and each volume id-mapped
 * at its `dest`, where crun binds it from. The upper dir is owned by the range's base: it is the
 * sandbox's `/`.
 */
export async function mountIdmappedRoot(o: {
  lowersBottomFirst: string[];
  upper: string;
  work: string;
  target: string;
  range: UidRange;
  usernsFile: string;
  volumes: { source: string; dest: string }[];
  /** The edge's dsec-spawn: dsec-idmap is started by it, not by a fork of the edge's large process. */
  spawner?: SpawnHelper | undefined;
}): Promise<void> {
  for (const d of [o.upper, o.work, o.target]) mkdirSync(d, { recursive: true });
  chownSync(o.upper, o.range.base, o.range.base);
  closeSync(openSync(o.usernsFile, 'w', 0o400)); // a file for the namespace to be bound on
  for (const v of o.volumes) mkdirSync(v.dest, { recursive: true });
  const args = ['--map', `${o.range.base}:${o.range.size}`, '--userns-file', o.usernsFile];
  if (o.spawner) {
    const r = await o.spawner.run(IDMAP_BINARY, args, { stdio: 'pipe' });
    if (r.code !== 0) throw new ToolError(IDMAP_BINARY, args, r);
  } else {
    await runToolOrThrow(IDMAP_BINARY, args);
  }
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
