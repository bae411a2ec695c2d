import { readFileSync, statSync } from 'node:fs';
import { IDMAP_BINARY, LANDLOCK_BINARY } from '../../../host/native-helpers.js';
import { ToolError, runToolOrThrow } from '../../../host/run-tool.js';
import type { SpawnHelper } from '../../../host/spawn-helper.js';
import { LANDLOCK_PATH } from './oci-config.js';

/**
 * After an edge upgrade: makes an adopted container sandbox's dsec-landlock the current build.
 *
 * Each sandbox has the host's dsec-landlock bound read-only at /dev/.dsec-landlock, and a rebuild
 * (scripts/setup) writes a new file, so a sandbox made before the upgrade keeps the old binary,
 * which may reject the flags this edge passes to every command (`--cgroup-fd`). When the bound
 * file is another one with other bytes, dsec-idmap --replace-file binds the current binary over
 * it inside the sandbox's mount namespace (it must join that namespace: a single-threaded
 * process, not the edge). The sandbox's init and the busybox of its toolbox are Debian's
 * packages, not rebuilt by an upgrade: they are left as they are.
 *
 * Returns whether the binary was replaced; throws, with the helper's reason, when it could not be.
 */
export async function refreshLandlockBinary(pid: number, spawner: SpawnHelper | undefined): Promise<boolean> {
  const inside = `/proc/${pid}/root${LANDLOCK_PATH}`;
  const bound = statSync(inside);
  const current = statSync(LANDLOCK_BINARY);
  // The usual case, no upgrade: the bind is of this very file, and nothing is read.
  if (bound.dev === current.dev && bound.ino === current.ino) return false;
  if (bound.size === current.size && readFileSync(inside).equals(readFileSync(LANDLOCK_BINARY))) return false;
  const args = ['--replace-file', LANDLOCK_BINARY, '--pid', String(pid), '--at', LANDLOCK_PATH];
  if (spawner) {
    const r = await spawner.run(IDMAP_BINARY, args, { stdio: 'pipe' });
    if (r.code !== 0) throw new ToolError(IDMAP_BINARY, args, r);
  } else {
    await runToolOrThrow(IDMAP_BINARY, args);
  }
  return true;
}
