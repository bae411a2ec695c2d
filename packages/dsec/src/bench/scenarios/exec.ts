import { summarizeLatency, timed, type LatencySummary } from '../latency.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { phaseKey, type Spans } from '../profile.js';
import { batchSizes, roundOrder } from '../rounds.js';

export interface ExecScenarioOptions {
  /** Timed execs per peer. @default 200 */
  count: number;
  /** Rounds the execs are split into, peers alternating. @default 10 */
  rounds: number;
  /** Untimed execs per peer first. @default 10 */
  warmup: number;
}

export interface PeerExecResult {
  name: Peer['name'];
  description: string;
  version: string;
  exec: LatencySummary;
  errors: string[];
}

export interface ExecScenarioResult {
  peers: PeerExecResult[];
  dropped: PeerUnavailable[];
  /** Timed execs of each peer. */
  ops: Record<string, number>;
}

export const PHASE_EXEC = 'exec';
const MAX_ERRORS = 3;

/** `true` run to completion in one idle sandbox per peer, one at a time, peers alternating. */
export async function runExecScenario(
  peers: Peer[],
  opts: ExecScenarioOptions,
  ctx: { signal: AbortSignal; spans: Spans; say: (m: string) => void },
): Promise<ExecScenarioResult> {
  const { signal, spans, say } = ctx;
  const dropped: PeerUnavailable[] = [];
  const states: { peer: Peer; id: string; lat: number[]; errors: string[] }[] = [];
  for (const peer of peers) {
    try {
      states.push({ peer, id: await peer.create(), lat: [], errors: [] });
    } catch (err) {
      dropped.push({ name: peer.name, reason: `could not create its sandbox: ${(err as Error).message}` });
    }
  }
  const live = (): typeof states => states.filter((s) => s.errors.length < MAX_ERRORS);
  const runOne = async (s: (typeof states)[number], into: number[]): Promise<void> => {
    try {
      await timed(into, () => s.peer.exec(s.id));
    } catch (err) {
      s.errors.push((err as Error).message);
      say(`${s.peer.name}: exec failed: ${(err as Error).message}`);
      if (s.errors.length === MAX_ERRORS)
        dropped.push({ name: s.peer.name, reason: `stopped after ${MAX_ERRORS} failed execs; last: ${s.errors.at(-1)}` });
    }
  };
  try {
    say(`warm-up: ${opts.warmup} execs per peer…`);
    for (const s of states) for (let i = 0; i < opts.warmup; i++) await runOne(s, []);
    const sizes = batchSizes(opts.count, opts.rounds);
    say(`exec: ${opts.count} per peer in ${sizes.length} alternating rounds…`);
    for (const [r, size] of sizes.entries()) {
      for (const s of roundOrder(live(), r)) {
        spans.phase = phaseKey(s.peer.name, PHASE_EXEC);
        for (let i = 0; i < size && s.errors.length < MAX_ERRORS; i++) {
          signal.throwIfAborted();
          await runOne(s, s.lat);
        }
        spans.phase = undefined;
      }
      say(`  round ${r + 1}/${sizes.length} done`);
    }
  } finally {
    spans.phase = undefined;
    for (const s of states) await s.peer.remove(s.id).catch(() => undefined);
  }
  return {
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.peer.execDescription,
      version: s.peer.version,
      exec: summarizeLatency(s.lat),
      errors: s.errors,
    })),
    dropped,
    ops: Object.fromEntries(states.map((s) => [s.peer.name, s.lat.length])),
  };
}
