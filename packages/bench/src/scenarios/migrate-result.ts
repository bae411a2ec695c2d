/**
 * `dsec bench migrate`'s options and result: moves between two real `dsec edge` daemons (issue
 * 33). Kept apart from the run (migrate.ts) and the rendering (migrate-report.ts), so neither
 * imports the other.
 */
import type { LatencySummary } from '../latency.js';
import type { PeerResultBase, ScenarioResult } from '../result-types.js';

export interface MigrateOptions {
  /** Moves timed per size of written data (a fresh sandbox each: a moved sandbox's data is in a lower layer and would not move again). */
  rounds: number;
  /** MiB written (random, /root/data) into the small and the large container before its move. */
  smallMib: number;
  largeMib: number;
  /** Guest memory of the microVM moved (0: skip the VM). */
  vmMemoryMib: number;
  /** Moves of the one microVM, back and forth between the edges (its whole memory moves each time). */
  vmRounds: number;
  /** Moves made while a caller polls the sandbox, per poll kind (`true`, a file read). */
  pollMoves: number;
  /** The caller's poll period (ms): a call starts every pollMs, or at once when the previous one took longer. */
  pollMs: number;
  /** Idle sandboxes on the edge drained with migrate (0: skip the drain). */
  drainCount: number;
}

/** One move as measured: the server's figures (MigrateResult) and the caller's, and what was checked after it. */
export interface MoveRecord {
  id: string;
  from: string;
  to: string;
  /** MigrateResult.ms: the call's start to running on the new edge, as the control plane timed it. */
  ms: number;
  /** MigrateResult.heldMs: quiesced (frozen, calls waiting) until running on the new edge. */
  heldMs: number;
  /** `sandbox.migrate()` as the caller waited for it (HTTP round trip included). */
  callMs: number;
  /** Bytes that moved: a container's packed writable layer, a VM's state blob. */
  bytes: number;
  /** The sandbox's row names the new edge, and the edge answered a call. */
  edgeChanged: boolean;
  /** Its data read back after the move has the checksum it had before (a VM: and its process runs on). */
  intact: boolean;
  /** What did not read back as it should, when not intact. */
  problem?: string;
}

/** Moves of one kind of sandbox: what each took and whether each really happened. */
export interface MoveSet {
  label: string;
  backend: 'container' | 'microvm';
  /** MiB written before the move (a VM: into its tmpfs, i.e. its memory). */
  writtenMib: number;
  /** Guest memory (a VM) or the memory limit (a container), MiB. */
  memoryMiB: number;
  moves: MoveRecord[];
  ms: LatencySummary;
  heldMs: LatencySummary;
  callMs: LatencySummary;
  bytesP50: number;
  /** Moves whose edge changed and whose data came over intact. */
  verified: number;
  errors: string[];
}

/** One move made while a caller polled the sandbox every pollMs. */
export interface PolledMove {
  from: string;
  to: string;
  ms: number;
  heldMs: number;
  /** The longest time between two successful answers from a poll before the move started to one after it ended. */
  longestGapMs: number;
  /** The slowest single successful call. */
  slowestCallMs: number;
  calls: number;
  failed: number;
  /** Moves refused SANDBOX_NOT_MIGRATABLE (the poll's `true` was running at the quiesce) and tried again. */
  refused: number;
  edgeChanged: boolean;
  intact: boolean;
}

/** A caller polling a sandbox during moves: what it saw. */
export interface DowntimeRun {
  kind: 'exec true' | 'file read';
  moves: PolledMove[];
  longestGapMs: LatencySummary;
  calls: number;
  failed: number;
  /** The failed calls' messages (the SDK retries SANDBOX_MIGRATING, so none should fail). */
  failures: string[];
  refused: number;
}

export interface DrainFigures {
  count: number;
  /** Sandboxes created on the other edge and moved to the drained one first (creates spread over both edges). */
  fillMoves: number;
  fillMs: LatencySummary;
  /** POST /v1/nodes/{id}/drain {migrate: true} until its last line. */
  totalMs: number;
  /** Each `moved` line's ms (the move as the control plane timed it; DRAIN_MOVES run at once). */
  perMove: LatencySummary;
  moved: number;
  stayed: { id: string; code: string; reason: string }[];
  /** The drained edge's state in the `done` line, or why there was none. */
  nodeState: string;
  /** Moved sandboxes whose row names the other edge and whose file reads back as written. */
  verified: number;
  errors: string[];
}

export interface MigrateResult extends ScenarioResult {
  peers: PeerResultBase[];
  /** The two edges (`dsec edge` child processes under a `dsec control`, loopback). */
  edges: string[];
  layout: string;
  containers: MoveSet[];
  vm: MoveSet | { unavailable: string };
  /** QEMU's accelerator for the VM (KVM or TCG, and why), from `dsec doctor`'s check. */
  vmAccel?: string;
  downtime: DowntimeRun[];
  drain: DrainFigures | { unavailable: string };
}
