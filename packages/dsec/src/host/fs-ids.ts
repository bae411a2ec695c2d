import { getGroups, setFsGid, setFsUid, setThreadGroups } from './syscalls.js';

/** A user as the host kernel checks file access for it: host ids (a user-namespaced sandbox's already mapped). */
export interface HostFsIds {
  uid: number;
  gid: number;
  groups: number[];
}

/** The edge's own supplementary groups, read once: what every switch gives back. */
let ownGroups: number[] | undefined;

/**
 * Runs `fn` with the calling thread's filesystem ids (setfsuid/setfsgid) and supplementary groups
 * (the raw setgroups system call) switched to `ids`, so the kernel checks each file access of `fn`
 * as it would for that user and what `fn` creates is that user's. All three are per-thread: the
 * edge's other threads (libuv's pool, crun's spawner) keep root's, and `fn` must be synchronous
 * (Node's *Sync fs calls and koffi's calls run on the calling thread; nothing else runs on it
 * meanwhile). A change of the fsuid from 0 drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
 * CAP_FOWNER, CAP_CHOWN, CAP_FSETID … from the effective set and the change back restores them
 * (capabilities(7), "Effect of user ID changes on capabilities"), so root's own calls after this
 * one keep their rights. Root's ids are restored in a `finally`, whatever `fn` throws.
 */
export function withFsIds<T>(ids: HostFsIds, fn: () => T): T {
  ownGroups ??= getGroups();
  try {
    setThreadGroups(ids.groups);
    setFsGid(ids.gid);
    setFsUid(ids.uid);
    return fn();
  } finally {
    restoreRootIds(ownGroups);
  }
}

/** Root's ids back on the calling thread: fsuid first, so the groups are set with root's rights. */
function restoreRootIds(groups: number[]): void {
  setFsUid(0);
  setFsGid(0);
  setThreadGroups(groups);
}
