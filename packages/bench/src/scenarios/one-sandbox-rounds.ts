import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { phaseKey } from '../profile.js';
import { batchSizes, roundOrder } from '../rounds.js';
import type { ScenarioContext } from './scenario.js';

export interface RoundsOptions {
  /** Timed steps per peer. */
  count: number;
  /** Rounds the steps are split into, peers alternating. */
  rounds: number;
  /** Untimed steps per peer first. */
  warmup: number;
}

export interface PeerTimings<K extends string> {
  peer: Peer;
  /** ms of every timed step, by what was timed. */
  timings: Record<K, number[]>;
  errors: string[];
}

const MAX_ERRORS = 3;

/** ms that `fn` took. */
export async function msOf(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

/**
 * One idle sandbox per peer, and `step` on it `count` times per peer, one at a time, in rounds
 * with peers alternating (after `warmup` untimed steps). `step` returns its timings by kind; a
 * peer is dropped after 3 failed steps. The sandboxes are removed at the end, also on failure.
 */
export async function oneSandboxRounds<K extends string>(
  peers: Peer[],
  kinds: readonly K[],
  opts: RoundsOptions & { phase: string; what: string },
  ctx: ScenarioContext,
  step: (peer: Peer, id: string) => Promise<Record<K, number>>,
): Promise<{ states: PeerTimings<K>[]; dropped: PeerUnavailable[] }> {
  const { signal, spans, say } = ctx;
  const dropped: PeerUnavailable[] = [];
  const states: (PeerTimings<K> & { id: string })[] = [];
  for (const peer of peers) {
    try {
      const timings = Object.fromEntries(kinds.map((k) => [k, []])) as unknown as Record<K, number[]>;
      states.push({ peer, id: await peer.create(), timings, errors: [] });
    } catch (err) {
      dropped.push({ name: peer.name, reason: `could not create its sandbox: ${(err as Error).message}` });
    }
  }
  const live = (): typeof states => states.filter((s) => s.errors.length < MAX_ERRORS);
  const runOne = async (s: (typeof states)[number], record: boolean): Promise<void> => {
    try {
      const t = await step(s.peer, s.id);
      if (record) for (const k of kinds) s.timings[k].push(t[k]);
    } catch (err) {
      s.errors.push((err as Error).message);
      say(`${s.peer.name}: ${opts.what} failed: ${(err as Error).message}`);
      if (s.errors.length === MAX_ERRORS)
        dropped.push({ name: s.peer.name, reason: `stopped after ${MAX_ERRORS} failures; last: ${s.errors.at(-1)}` });
    }
  };
  try {
    say(`warm-up: ${opts.warmup} per peer…`);
    for (const s of states) for (let i = 0; i < opts.warmup; i++) await runOne(s, false);
    const sizes = batchSizes(opts.count, opts.rounds);
    say(`${opts.what}: ${opts.count} per peer in ${sizes.length} alternating rounds…`);
    for (const [r, size] of sizes.entries()) {
      for (const s of roundOrder(live(), r)) {
        spans.phase = phaseKey(s.peer.name, opts.phase);
        for (let i = 0; i < size && s.errors.length < MAX_ERRORS; i++) {
          signal.throwIfAborted();
          await runOne(s, true);
        }
        spans.phase = undefined;
      }
      say(`  round ${r + 1}/${sizes.length} done`);
    }
  } finally {
    spans.phase = undefined;
    for (const s of states) await s.peer.remove(s.id).catch(() => undefined);
  }
  return { states, dropped };
}
