import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import type { PeerName } from './peers/peer.js';

/** Every run's temp dir is `/var/tmp/dsec-bench-<run id>`: on the host's disk, where EROFS blobs mount file-backed. */
export const TEMP_ROOT = '/var/tmp';
export const NAME_PREFIX = 'dsec-bench-';

/**
 * The names one run gives what it makes on the host — temp dir, dsec edge id (so sandboxes are
 * `sb-bench<id>-…` and their cgroups `dsec/sb-bench<id>-…`) and each peer's cgroup parent — so
 * that two runs on one host (or a run beside other dsec servers) never touch each other's.
 */
export interface RunNames {
  id: string;
  dir: string;
  edgeId: string;
  /** Cgroup name prefix of dsec's sandboxes, under dsec's own parent. */
  sandboxPrefix: string;
  /** Top-level cgroup parent of a peer's containers. */
  cgroupParent(peer: Exclude<PeerName, 'dsec'>): string;
}

export function runNames(id = randomBytes(3).toString('hex')): RunNames {
  const edgeId = `bench${id}`;
  return {
    id,
    dir: join(TEMP_ROOT, `${NAME_PREFIX}${id}`),
    edgeId,
    sandboxPrefix: `sb-${edgeId}-`,
    cgroupParent: (peer) => `${NAME_PREFIX}${id}-${peer}`,
  };
}
