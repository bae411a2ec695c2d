import { chmodSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Directories of the node's that every sandbox's config binds read-only where it would otherwise
 * get a tmpfs of its own: the masked directories (/proc/acpi, /sys/firmware, …: crun masks a
 * directory with a read-only tmpfs) and the root of /sys/fs/cgroup (under the hierarchies'
 * binds, edge/oci-config.ts cgroupMounts).
 *
 * Why: every tmpfs is a superblock, and every superblock registers a shrinker the memory cgroups
 * track. Each new memory cgroup (one per sandbox) allocates a slot for every shrinker id the host
 * has ever had at once (the kernel's alloc_shrinker_info: 520 bytes per 64 ids, a high-water mark
 * that never falls until reboot), and each removal walks the list_lrus of every superblock. So a
 * sandbox's superblocks cost every other sandbox memory and create time: the node's total grows
 * with the square of its sandboxes. Measured at 600 held, 76 % of the 1 KiB allocations of a create
 * were alloc_shrinker_info (perf record -e kmem:kmalloc). A bind makes no superblock.
 *
 * Both dirs are root's, mode 0555, and never removed while the node runs: a sandbox's binds hold
 * them, and removing a dir another mount namespace has a mount on would detach that mount there.
 */
export interface MountStubs {
  /** An empty directory: what a masked directory shows. */
  emptyDir: string;
  /** /sys/fs/cgroup's root: an empty directory per hierarchy name, each a mount point for its bind. */
  cgroupRoot: string;
}

/**
 * Where the stubs live: one host-wide dir outside any data dir, shared by every edge on the host
 * (their contents are the same: an empty dir, and the host's cgroup names). Not under the data
 * dir: a bind's source path shows in the sandbox's /proc/self/mountinfo, and the data dir's path
 * must not (security/mountinfo.test.ts); under /run it shows as /dsec-mount-stubs/….
 */
export const MOUNT_STUBS_DIR = '/run/dsec-mount-stubs';

/** Makes (or keeps) the stubs under `base`: `names` are every name /sys/fs/cgroup shows. */
export function prepareMountStubs(names: readonly string[], base: string = MOUNT_STUBS_DIR): MountStubs {
  const emptyDir = join(base, 'empty');
  const cgroupRoot = join(base, 'cgroup');
  for (const d of [base, emptyDir, cgroupRoot]) mkdirSync(d, { recursive: true });
  // Left there by hand or an older dsec: an "empty" dir with entries would show them in every sandbox.
  for (const entry of readdirSync(emptyDir)) rmSync(join(emptyDir, entry), { recursive: true, force: true });
  for (const name of names) mkdirSync(join(cgroupRoot, name), { recursive: true });
  // Read-only for all once made (made writable first: only root could fill a 0555 dir).
  for (const d of [...names.map((n) => join(cgroupRoot, n)), emptyDir, cgroupRoot, base]) chmodSync(d, 0o555);
  return { emptyDir, cgroupRoot };
}

/**
 * The paths that are directories now. Read again at every create: one can come and go with a
 * module (/proc/asound with snd, /sys/devices/virtual/powercap with intel_rapl), and a bind to an
 * absent path inside procfs or sysfs would fail the create, where crun's own mask skips it.
 */
export function existingDirs(paths: readonly string[]): string[] {
  return paths.filter((p) => {
    try {
      return statSync(p).isDirectory();
    } catch {
      return false; // absent on this kernel now: crun skips it
    }
  });
}
