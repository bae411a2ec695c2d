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

/** One side of the real run: `count` sandboxes created and running `echo ok`, `concurrency` in flight, then removed. */
async function realSide(
  peer: DsecApiPeer | Peer,
  count: number,
  concurrency: number,
  description: string,
  signal: AbortSignal,
): Promise<RealSide> {
  const errors: string[] = [];
  const ids: string[] = [];
  const create: number[] = [];
  const createExec: number[] = [];
  const perEdge: PerEdge = {};
  const t0 = performance.now();
  await pool(count, concurrency, async () => {
    if (signal.aborted || errors.length >= 3) return;
    const t = performance.now();
    try {
      const id = await peer.create();
      create.push(performance.now() - t);
      ids.push(id);
      const edge = /^sb-([a-z0-9]+)-/.exec(id)?.[1] ?? '?';
      perEdge[edge] = (perEdge[edge] ?? 0) + 1;
      const out = await peer.exec(id, ['echo', 'ok']);
      if (out.trim() !== 'ok') throw new Error(`echo ok printed ${JSON.stringify(out)}`);
      createExec.push(performance.now() - t);
    } catch (err) {
      errors.push((err as Error).message);
    }
  });
  const seconds = (performance.now() - t0) / 1000;
  await pool(ids.length, concurrency, async (i) => {
    await peer.remove(ids[i]!).catch((err: unknown) => void errors.push(`remove: ${(err as Error).message}`));
  });
  signal.throwIfAborted();
  return {
    description,
    completed: createExec.length,
    seconds: round(seconds, 2),
    perSecond: round(createExec.length / seconds, 1),
    create: summarizeLatency(create),
    createExec: summarizeLatency(createExec),
    perEdge,
    errors,
  };
}

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
    await realSide(peer, 6, 6, 'warm-up', signal);
    say(`  all-in-one: ${opts.realCount} sandboxes + echo ok, ${opts.realConcurrency} in flight…`);
    const allInOne = await realSide(
      aio,
      opts.realCount,
      opts.realConcurrency,
      `dsec up (all-in-one, in-process edge): ${aio.description}`,
      signal,
    );
    say(`  cluster: ${opts.realCount} sandboxes + echo ok, ${opts.realConcurrency} in flight…`);
    const cluster = await realSide(
      peer,
      opts.realCount,
      opts.realConcurrency,
      'dsec control + 3 × dsec edge (child processes, loopback HTTP edge protocol, crun), same SDK calls',
      signal,
    );
    return { count: opts.realCount, concurrency: opts.realConcurrency, allInOne, cluster };
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
