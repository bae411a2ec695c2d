import { existsSync } from 'node:fs';
import { runToolOrThrow } from './run-tool.js';

/**
 * Removes a directory tree that a sandbox controlled (its upper dir, a snapshot's staging copy).
 * A sandbox can make a tree of any depth: 2,100 nested `d` directories already put its deepest
 * path past PATH_MAX, where Node's rmSync (full paths, recursion) fails with ENAMETOOLONG or a
 * stack overflow. GNU rm walks with fts over directory file descriptors (openat/unlinkat relative
 * to the parent, no full paths, no recursion on the C stack), so depth does not matter. It is the
 * host's own /bin/rm, never anything from the sandbox, and `--one-file-system` keeps it from
 * descending into a mount that is still there (it fails instead, naming it).
 */
export async function removeTree(path: string): Promise<void> {
  if (!existsSync(path)) return;
  await runToolOrThrow('/bin/rm', ['-rf', '--one-file-system', '--', path]);
}
