import type { CgroupScope } from '../cgroup-memory.js';

export type PeerName = 'dsec' | 'crun' | 'podman' | 'docker';

/** The peers `--peers` may name; dsec itself always runs, and raw crun (the floor) always does too. */
export const OPTIONAL_PEERS: readonly PeerName[] = ['crun', 'podman', 'docker'];

/**
 * One side of the comparison: something that starts an idle busybox sandbox with a 64 MiB
 * memory limit, runs `true` in it, and removes it. Every call throws with the tool's own
 * stderr on failure.
 */
export interface Peer {
  readonly name: PeerName;
  /** What exactly is timed, e.g. "crun run -d (dsec's OCI config, overlay, catatonit)". */
  readonly description: string;
  /** What exactly an exec timing covers, e.g. "crun exec ID true". */
  readonly execDescription: string;
  readonly version: string;
  /** Where its sandboxes' cgroups are, for the cgroup-charged memory figure. */
  readonly cgroupScope: CgroupScope;
  /** Starts one idle sandbox; resolves once it runs; returns its id. */
  create(): Promise<string>;
  /** Runs `true` in a sandbox and waits for it; throws on a non-zero exit. */
  exec(id: string): Promise<void>;
  remove(id: string): Promise<void>;
  /** Removes every sandbox it made and whatever it set up. Safe to call twice. */
  close(): Promise<void>;
}

/** A peer that was asked for and could not run: it is reported with why, never dropped silently. */
export interface PeerUnavailable {
  name: PeerName;
  reason: string;
}

export function parsePeers(list: string): PeerName[] {
  const names = list
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const n of names) {
    if (!(OPTIONAL_PEERS as readonly string[]).includes(n))
      throw new Error(`unknown peer ${JSON.stringify(n)}; choose from ${OPTIONAL_PEERS.join(', ')}`);
  }
  // crun is the floor every ratio is taken against: it always runs.
  return [...new Set<PeerName>(['crun', ...(names as PeerName[])])];
}
