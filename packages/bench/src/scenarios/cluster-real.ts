/**
 * `dsec bench cluster`'s real run: `dsec control` and three `dsec edge` daemons (real crun) as
 * child processes on loopback, the same SDK calls as against the run's all-in-one, side by side.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { startControlChild, startEdgeChild, waitForEdges, type BenchChild } from '../cluster-processes.js';
import { BENCH_IMAGE } from '../fixture.js';
import { summarizeLatency } from '../latency.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer } from '../peers/peer.js';
import { BENCH_LIMITS } from '../peers/setup.js';
import { pool } from '../rounds.js';
import { round } from '../stats.js';
import type { ClusterOptions, PerEdge, RealRun, RealSide } from './cluster-result.js';
import type { ScenarioContext } from './scenario.js';

/** What one side of the real run measured so far (its rounds together). */
interface SideSamples {
  create: number[];
  createExec: number[];
  seconds: number;
  perEdge: PerEdge;
  errors: string[];
}

const noSamples = (): SideSamples => ({ create: [], createExec: [], seconds: 0, perEdge: {}, errors: [] });

/** One round of one side: `count` sandboxes created and running `echo ok`, `concurrency` in flight, then removed. */
async function realRound(
  peer: DsecApiPeer | Peer,
  count: number,
  concurrency: number,
  into: SideSamples,
  signal: AbortSignal,
): Promise<void> {
  const { errors, perEdge } = into;
  const ids: string[] = [];
  const t0 = performance.now();
  await pool(count, concurrency, async () => {
    if (signal.aborted || errors.length >= 3) return;
    const t = performance.now();
    try {
      const id = await peer.create();
      into.create.push(performance.now() - t);
      ids.push(id);
      const edge = /^sb-([a-z0-9]+)-/.exec(id)?.[1] ?? '?';
      perEdge[edge] = (perEdge[edge] ?? 0) + 1;
      const out = await peer.exec(id, ['echo', 'ok']);
      if (out.trim() !== 'ok') throw new Error(`echo ok printed ${JSON.stringify(out)}`);
      into.createExec.push(performance.now() - t);
    } catch (err) {
      errors.push((err as Error).message);
    }
  });
  into.seconds += (performance.now() - t0) / 1000;
  await pool(ids.length, concurrency, async (i) => {
    await peer.remove(ids[i]!).catch((err: unknown) => void errors.push(`remove: ${(err as Error).message}`));
  });
  signal.throwIfAborted();
}

function summarizeSide(description: string, s: SideSamples): RealSide {
  return {
    description,
    completed: s.createExec.length,
    seconds: round(s.seconds, 2),
    perSecond: round(s.createExec.length / s.seconds, 1),
    create: summarizeLatency(s.create),
    createExec: summarizeLatency(s.createExec),
    perEdge: s.perEdge,
    errors: s.errors,
  };
}

/**
 * Rounds per side in the real run, alternating ABBA…: a load on this shared machine that drifts
 * through the run weighs on both sides alike (one round each, the all-in-one first, once put the
 * cluster behind a load the all-in-one had not had).
 */
export const REAL_ROUNDS = 4;

/** Three `dsec edge` daemons (real crun) under a `dsec control`, side by side with the all-in-one dsec of the run. */
export async function runReal(peers: Peer[], opts: ClusterOptions, ctx: ScenarioContext): Promise<RealRun | { unavailable: string }> {
  const { names, say, signal } = ctx;
  const aio = peers.find((p) => p.name === 'dsec');
  if (!aio) return { unavailable: 'the all-in-one dsec peer did not start' };
  const dir = join(names.dir, 'cluster-real');
  mkdirSync(dir, { recursive: true });
  const children: BenchChild[] = [];
  let control: Awaited<ReturnType<typeof startControlChild>> | undefined;
  let peer: DsecApiPeer | undefined;
  try {
    say(`real run: dsec control + 3 dsec edge daemons (crun) on loopback, each with its own data dir under ${dir}…`);
    control = await startControlChild(join(dir, 'control'));
    const ids = [1, 2, 3].map((k) => `${names.edgeId}r${k}`);
    for (const [k, id] of ids.entries()) {
      const e = await startEdgeChild({
        join: control.url,
        token: control.joinToken,
        id,
        dataDir: join(dir, `edge${k + 1}`),
        maxSandboxes: Math.max(100, opts.realCount * 2),
      });
      children.push(e.child);
    }
    await waitForEdges(control.url, control.apiKey, ids);
    peer = new DsecApiPeer(
      { url: control.url, apiKey: control.apiKey },
      BENCH_IMAGE,
      BENCH_LIMITS,
      { bench: names.id },
      aio.version,
      `sb-${names.edgeId}r`,
    );
    // Warm-up: each edge fetches the busybox layer from the control plane's blob endpoint once.
    say('  warm-up (each edge fetches the busybox layer once)…');
    await realRound(peer, 6, 6, noSamples(), signal);
    const sides = { allInOne: noSamples(), cluster: noSamples() };
    const perRound = Math.max(1, Math.round(opts.realCount / REAL_ROUNDS));
    for (let r = 0; r < REAL_ROUNDS; r++) {
      // ABBA ABBA …: the all-in-one first in rounds 0 and 3 of every four.
      const order = r % 4 === 0 || r % 4 === 3 ? (['allInOne', 'cluster'] as const) : (['cluster', 'allInOne'] as const);
      for (const side of order) {
        say(
          `  round ${r + 1}/${REAL_ROUNDS}, ${side === 'allInOne' ? 'all-in-one' : 'cluster'}: ${perRound} sandboxes + echo ok, ${opts.realConcurrency} in flight…`,
        );
        await realRound(side === 'allInOne' ? aio : peer, perRound, opts.realConcurrency, sides[side], signal);
      }
    }
    const allInOne = summarizeSide(`dsec up (all-in-one, in-process edge): ${aio.description}`, sides.allInOne);
    const cluster = summarizeSide(
      'dsec control + 3 × dsec edge (child processes, loopback HTTP edge protocol, crun), same SDK calls',
      sides.cluster,
    );
    return { count: perRound * REAL_ROUNDS, concurrency: opts.realConcurrency, rounds: REAL_ROUNDS, allInOne, cluster };
  } catch (err) {
    if (signal.aborted) throw err;
    say(`real run failed: ${(err as Error).message}`);
    return { unavailable: `the real run failed: ${(err as Error).message}` };
  } finally {
    await peer?.close().catch(() => undefined);
    for (const c of children.reverse()) await c.stop();
    await control?.child.stop();
  }
}
