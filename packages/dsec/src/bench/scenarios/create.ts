import { percentile, round } from '../../demo/stats.js';
import { cgroupCharged } from '../cgroup-memory.js';
import { summarizeLatency, timed, type LatencySummary } from '../latency.js';
import { addMem, memUsed, settledMeminfo, ZERO_MEM, type MemSnapshot } from '../meminfo.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { phaseKey, type Spans } from '../profile.js';
import { batchSizes, pool, roundOrder } from '../rounds.js';

export interface CreateScenarioOptions {
  /** Sandboxes each peer creates one at a time (and keeps, for the memory figure). @default 200 */
  count: number;
  /** Creates in flight at once in the throughput phase. @default 8 */
  concurrency: number;
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

export interface PeerCreateResult {
  name: Peer['name'];
  description: string;
  version: string;
  /** One create at a time, the rest of the population idle. */
  sequential: LatencySummary;
  concurrent: { concurrency: number; created: number; wallSeconds: number; createsPerSecond: number; latency: LatencySummary };
  remove: LatencySummary;
  memory: PeerMemory;
  errors: string[];
}

export interface CreateScenarioResult {
  peers: PeerCreateResult[];
  /** Peers that stopped working during the run, with why. */
  dropped: PeerUnavailable[];
  /** Timed creates of each peer in each phase (a profile divides by these). */
  ops: Record<string, { sequential: number; concurrent: number }>;
}

export const PHASE_SEQUENTIAL = 'create, sequential';
export const PHASE_CONCURRENT = 'create, concurrent';
const MAX_ERRORS = 3;

interface PeerState {
  peer: Peer;
  live: string[];
  seq: number[];
  conc: number[];
  concWall: number;
  concCreated: number;
  rm: number[];
  used: MemSnapshot;
  usedCount: number;
  freed: MemSnapshot;
  freedCount: number;
  chargedKiB: number;
  batchMiB: number[];
  errors: string[];
}

/**
 * Sequential creates with the population growing to `count` per peer (memory read between
 * batches, so each peer's batches are charged only to it), sequential removes the same way, then
 * throughput with `concurrency` creates in flight. Peers alternate batch by batch throughout.
 */
export async function runCreateScenario(
  peers: Peer[],
  opts: CreateScenarioOptions,
  ctx: { signal: AbortSignal; spans: Spans; say: (m: string) => void },
): Promise<CreateScenarioResult> {
  const { signal, spans, say } = ctx;
  const states = peers.map<PeerState>((peer) => ({
    peer,
    live: [],
    seq: [],
    conc: [],
    concWall: 0,
    concCreated: 0,
    rm: [],
    used: ZERO_MEM,
    usedCount: 0,
    freed: ZERO_MEM,
    freedCount: 0,
    chargedKiB: NaN,
    batchMiB: [],
    errors: [],
  }));
  const dropped: PeerUnavailable[] = [];
  const active = (): PeerState[] => states.filter((s) => !dropped.some((d) => d.name === s.peer.name));
  const fail = (s: PeerState, what: string, err: unknown): void => {
    s.errors.push(`${what}: ${(err as Error).message}`);
    say(`${s.peer.name}: ${what} failed: ${(err as Error).message}`);
    if (s.errors.length >= MAX_ERRORS && !dropped.some((d) => d.name === s.peer.name))
      dropped.push({ name: s.peer.name, reason: `stopped after ${MAX_ERRORS} failures; last: ${s.errors.at(-1)}` });
  };

  say(`warm-up: ${opts.warmup} creates and removes per peer…`);
  for (const s of states) {
    for (let i = 0; i < opts.warmup; i++) {
      signal.throwIfAborted();
      try {
        await s.peer.remove(await s.peer.create());
      } catch (err) {
        fail(s, 'warm-up', err);
      }
    }
  }

  const seqSizes = batchSizes(opts.count, opts.rounds);
  say(`sequential: ${opts.count} creates per peer in ${seqSizes.length} alternating rounds, all kept running…`);
  let last = await settledMeminfo(opts.settleMs);
  for (const [r, size] of seqSizes.entries()) {
    for (const s of roundOrder(active(), r)) {
      const before = last;
      let made = 0;
      spans.phase = phaseKey(s.peer.name, PHASE_SEQUENTIAL);
      for (let i = 0; i < size; i++) {
        signal.throwIfAborted();
        try {
          s.live.push(await timed(s.seq, () => s.peer.create()));
          made++;
        } catch (err) {
          fail(s, 'create', err);
          break;
        }
      }
      spans.phase = undefined;
      last = await settledMeminfo(opts.settleMs);
      const used = memUsed(before, last);
      s.used = addMem(s.used, used);
      s.usedCount += made;
      if (made > 0) s.batchMiB.push(used.memAvailableKiB / made / 1024);
    }
    say(`  round ${r + 1}/${seqSizes.length}: ${states.map((s) => `${s.peer.name} ${s.live.length}`).join(', ')} running`);
  }

  for (const s of states) s.chargedKiB = s.live.length > 0 ? cgroupCharged(s.peer.cgroupScope) / 1024 / s.live.length : NaN;

  say('removing them, one at a time, in alternating rounds…');
  for (const [r, size] of seqSizes.entries()) {
    for (const s of roundOrder(states, r)) {
      const before = last;
      let removed = 0;
      for (let i = 0; i < size && s.live.length > 0; i++) {
        signal.throwIfAborted();
        const id = s.live.pop()!;
        try {
          await timed(s.rm, () => s.peer.remove(id));
          removed++;
        } catch (err) {
          fail(s, `remove ${id}`, err);
        }
      }
      last = await settledMeminfo(opts.settleMs);
      // Removal frees memory: "used" is negative, and its negation is what the sandboxes held.
      s.freed = addMem(s.freed, memUsed(last, before));
      s.freedCount += removed;
    }
  }

  const concSizes = batchSizes(opts.count, opts.throughputRounds);
  say(`throughput: ${opts.count} creates per peer, ${opts.concurrency} in flight, in ${concSizes.length} alternating rounds…`);
  for (const [r, size] of concSizes.entries()) {
    for (const s of roundOrder(active(), r)) {
      signal.throwIfAborted();
      const ids: string[] = [];
      spans.phase = phaseKey(s.peer.name, PHASE_CONCURRENT);
      const t0 = performance.now();
      try {
        await pool(size, opts.concurrency, async () => {
          signal.throwIfAborted();
          ids.push(await timed(s.conc, () => s.peer.create()));
        });
        s.concWall += (performance.now() - t0) / 1000;
        s.concCreated += size;
      } catch (err) {
        if (signal.aborted) throw err;
        fail(s, 'concurrent create', err);
      } finally {
        spans.phase = undefined;
      }
      // Removed untimed, then a pause, so teardown work does not spill into the next peer's batch.
      await pool(ids.length, opts.concurrency, (i) => s.peer.remove(ids[i]!)).catch((err: unknown) =>
        fail(s, 'remove after throughput batch', err),
      );
      await new Promise((res) => setTimeout(res, opts.settleMs));
    }
    say(`  round ${r + 1}/${concSizes.length} done`);
  }

  const perKiB = (kib: number, n: number): number => (n > 0 ? round(kib / n, 1) : NaN);
  return {
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.peer.description,
      version: s.peer.version,
      sequential: summarizeLatency(s.seq),
      concurrent: {
        concurrency: opts.concurrency,
        created: s.concCreated,
        wallSeconds: round(s.concWall, 2),
        createsPerSecond: s.concWall > 0 ? round(s.concCreated / s.concWall, 1) : NaN,
        latency: summarizeLatency(s.conc),
      },
      remove: summarizeLatency(s.rm),
      memory: {
        sandboxes: s.usedCount,
        perSandboxMiB: s.usedCount > 0 ? round(s.used.memAvailableKiB / s.usedCount / 1024, 3) : NaN,
        perSandboxMiBMedian: round(percentile(s.batchMiB, 50), 3),
        perSandboxMiBBatchRange: [round(Math.min(...s.batchMiB), 3), round(Math.max(...s.batchMiB), 3)],
        freedPerSandboxMiB: s.freedCount > 0 ? round(s.freed.memAvailableKiB / s.freedCount / 1024, 3) : NaN,
        slabPerSandboxKiB: perKiB(s.used.slabKiB, s.usedCount),
        cgroupChargedPerSandboxKiB: round(s.chargedKiB, 1),
        sUnreclaimPerSandboxKiB: perKiB(s.used.sUnreclaimKiB, s.usedCount),
        kernelStackPerSandboxKiB: perKiB(s.used.kernelStackKiB, s.usedCount),
        pageTablesPerSandboxKiB: perKiB(s.used.pageTablesKiB, s.usedCount),
      },
      errors: s.errors,
    })),
    dropped,
    ops: Object.fromEntries(states.map((s) => [s.peer.name, { sequential: s.seq.length, concurrent: s.conc.length }])),
  };
}
