/** `dsec bench rollout`'s options and result: shared by the run (rollout.ts) and its rendering (rollout-report.ts). */
import type { LatencySummary } from '../latency.js';
import type { PeerResultBase, ScenarioResult } from '../result-types.js';
import type { RolloutClientName } from './rollout-clients.js';

export interface RolloutOptions {
  /** Sandboxes per client, one run each. @default [1, 32, 256] */
  sandboxes: number[];
  /** Timed steps each sandbox runs, at least. @default 3 */
  steps: number;
  /** Timed steps per client and size, at least (a small size runs more steps per sandbox). @default 64 */
  minSteps: number;
  /** Rounds a size's steps are split into, clients alternating. @default 2 */
  rounds: number;
}

/** One client at one size. */
export interface RolloutRun {
  client: RolloutClientName;
  sandboxes: number;
  stepsPerSandbox: number;
  /** Timed steps that ran to the end (their answers right or not). */
  steps: number;
  /** Of those, the ones whose every checked output was right. */
  verified: number;
  /** Steps whose output was not what the commands print when they ran (see rollout-step.ts). */
  wrong: number;
  /** Steps a call of which failed. */
  failed: number;
  /** Wall time of the timed runs, summed over rounds. */
  seconds: number;
  /** Steps that ran to the end per wall second, all sandboxes together. */
  stepsPerSecond: number;
  /**
   * CPU time of the client's own process per step (ms), where it has one (the SDK clients; null for
   * a runtime's exec, whose calls are processes of their own started from the bench's).
   */
  clientCpuMsPerStep: number | null;
  /** One step, write to read back (ms). */
  step: LatencySummary;
  /** p50 of each part (ms): the write, one of the 9 other commands, the test run, the read. */
  partsP50: { write: number; command: number; testRun: number; read: number };
  /** The first few wrong answers and failures, verbatim. */
  problems: string[];
}

export interface RolloutClientInfo {
  client: RolloutClientName;
  description: string;
  version: string;
  image: string;
}

export interface RolloutResult extends ScenarioResult {
  peers: PeerResultBase[];
  clients: RolloutClientInfo[];
  runs: RolloutRun[];
  /** Clients that did not run (at all, or at one size), with why. */
  skipped: { client: RolloutClientName; sandboxes?: number; reason: string }[];
}
