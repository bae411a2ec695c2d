import type { CgroupScope } from '../cgroup-memory.js';

/** `floor` is not a sandbox tool: `dsec bench exec`'s kernel floor on raw crun's containers (exec-floor.ts). */
export type PeerName = 'dsec' | 'crun' | 'podman' | 'docker' | 'floor';

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
  /** Runs `cmd` (default `true`) in a sandbox and waits for it; returns its stdout; throws on a non-zero exit. */
  exec(id: string, cmd?: string[]): Promise<string>;
  /** Freezes every process of a sandbox (cgroup freezer); resolves once frozen. */
  pause(id: string): Promise<void>;
  resume(id: string): Promise<void>;
  /** What a pause/resume timing covers, e.g. "crun pause ID / crun resume ID". */
  readonly pauseDescription: string;
  /** Snapshots of a running sandbox and sandboxes started from them, or why the peer has none. */
  readonly snapshots: { ops: SnapshotOps } | { unavailable: string };
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

/** A peer's way to capture a running sandbox as an image and start sandboxes from it. */
export interface SnapshotOps {
  /** What each timing covers, e.g. "podman commit ID / podman run -d IMAGE". */
  readonly description: string;
  /** Captures the sandbox's changes; returns the image to start from. */
  snapshot(id: string): Promise<string>;
  /** Starts one idle sandbox from a snapshot image; returns its id. */
  createFrom(image: string): Promise<string>;
  /** One snapshot of `id` and `count` sandboxes from it; returns their ids (and the image, to remove). */
  fork(id: string, count: number): Promise<{ ids: string[]; image: string }>;
  /** Removes a snapshot image once no sandbox uses it. */
  removeImage(image: string): Promise<void>;
}
