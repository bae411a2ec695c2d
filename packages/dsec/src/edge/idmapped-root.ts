import { chownSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { IDMAP_BINARY } from '../host/native-helpers.js';
import { runToolOrThrow } from '../host/run-tool.js';
import type { UidRange } from '../host/uid-ranges.js';

/**
 * The root of a sandbox that runs in a user namespace (edge option `userns`), made by dsec-idmap
 * (native/idmap-mount.c) in one call: the sandbox's user namespace (owned by the range's base
 * uid, mapping 0..size-1 to the range), bound on `usernsFile` for crun to join; the overlay at
 * `target` over id-mapped clones of the shared layers, so files of host uid 0 in a layer are the
 * sandbox's root inside, handed to overlayfs as file descriptors (no layer mount of its own
 * appears anywhere, nor the layers' host paths in the overlay's options); and each volume
 * id-mapped at its `dest`, where crun binds it from. The upper dir is owned by the range's base:
 * it is the sandbox's `/`.
 */
export async function mountIdmappedRoot(o: {
  lowersBottomFirst: string[];
  upper: string;
  work: string;
  target: string;
  range: UidRange;
  usernsFile: string;
  volumes: { source: string; dest: string }[];
}): Promise<void> {
  for (const d of [o.upper, o.work, o.target]) mkdirSync(d, { recursive: true });
  chownSync(o.upper, o.range.base, o.range.base);
  closeSync(openSync(o.usernsFile, 'w', 0o400)); // a file for the namespace to be bound on
  for (const v of o.volumes) mkdirSync(v.dest, { recursive: true });
  const args = ['--map', `${o.range.base}:${o.range.size}`, '--userns-file', o.usernsFile, '--overlay', o.target, o.upper, o.work];
  for (const l of [...o.lowersBottomFirst].reverse()) args.push('--lower', l);
  for (const v of o.volumes) args.push('--bind', v.source, v.dest);
  await runToolOrThrow(IDMAP_BINARY, args);
}
