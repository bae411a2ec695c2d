/** `dsec bench create`'s options and result: shared by the run (create.ts) and its rendering (create-report.ts). */
import type { LatencySummary } from '../latency.js';
import type { PeerUnavailable } from '../peers/peer.js';
import type { PeerResultBase, ScenarioResult } from '../result-types.js';

export interface CreateScenarioOptions {
  /** Sandboxes each peer creates one at a time (and keeps, for the memory figure). @default 200 */
  count: number;
  /** Creates in flight at once in the throughput phase. @default 8 */
  concurrency: number;
  /** A second throughput phase with this many in flight (issue 6: 50 concurrent); 0 skips it. @default 50 */
  concurrencyHigh: number;
  /** Rounds the sequential phase is split into, peers alternating. @default 8 */
  rounds: number;
  /** Rounds of the throughput phase (count creates per peer in all). @default 4 */
  throughputRounds: number;
  /** Untimed creates+removes per peer before measuring. @default 5 */
  warmup: number;
  /** Pause before each memory reading. @default 1000 */
  settleMs: number;
}

export interface PeerMemory {
  /** Sandboxes the readings cover. */
  sandboxes: number;
  /** Drop in MemAvailable per idle sandbox: all batches' drops over all sandboxes (MiB). */
  perSandboxMiB: number;
  /**
   * The same per batch, median over batches (MiB): robust to another job on the host taking or
   * freeing hundreds of MiB during one batch, which moves the plain figure by a MiB or more.
   */
  perSandboxMiBMedian: number;
  /** Lowest and highest batch figure (MiB): how noisy the host was. */
  perSandboxMiBBatchRange: [number, number];
  /** Rise in MemAvailable per sandbox when they were all removed (MiB): the same cost seen from the other side. */
  freedPerSandboxMiB: number;
  slabPerSandboxKiB: number;
  /** Charged to the sandboxes' own cgroups, per sandbox, with all of them idle (KiB). */
  cgroupChargedPerSandboxKiB: number;
  sUnreclaimPerSandboxKiB: number;
  kernelStackPerSandboxKiB: number;
  pageTablesPerSandboxKiB: number;
}

export interface Throughput {
  concurrency: number;
  created: number;
  wallSeconds: number;
  createsPerSecond: number;
  latency: LatencySummary;
}

export interface PeerCreateResult extends PeerResultBase {
  /** One create at a time, the rest of the population idle. */
  sequential: LatencySummary;
  concurrent: Throughput;
  /** The same with `concurrencyHigh` in flight; absent when that phase was skipped (and in older results). */
  concurrentHigh?: Throughput;
  remove: LatencySummary;
  memory: PeerMemory;
}

export interface CreateScenarioResult extends ScenarioResult {
  peers: PeerCreateResult[];
  /** Peers that stopped working during the run, with why. */
  dropped: PeerUnavailable[];
  /** Timed creates of each peer in each phase (a profile divides by these). */
  ops: Record<string, { sequential: number; concurrent: number; concurrentHigh?: number }>;
}

export const PHASE_SEQUENTIAL = 'create, sequential';
export const PHASE_CONCURRENT = 'create, concurrent';
export const PHASE_CONCURRENT_HIGH = 'create, concurrent (high)';
