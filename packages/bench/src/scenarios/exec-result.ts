/** `dsec bench exec`'s options and result: shared by the run (exec.ts) and its rendering (exec-report.ts). */
import type { LatencySummary } from '../latency.js';
import type { PeerUnavailable } from '../peers/peer.js';
import type { PeerResultBase, ScenarioResult } from '../result-types.js';

export interface ExecScenarioOptions {
  /** Timed execs per peer. @default 200 */
  count: number;
  /** Rounds the execs are split into, peers alternating. @default 10 */
  rounds: number;
  /** Untimed execs per peer first. @default 10 */
  warmup: number;
}

export interface PeerExecResult extends PeerResultBase {
  exec: LatencySummary;
}

export interface ExecScenarioResult extends ScenarioResult {
  peers: PeerExecResult[];
  dropped: PeerUnavailable[];
  /** Timed execs of each peer. */
  ops: Record<string, number>;
}

export const PHASE_EXEC = 'exec';
