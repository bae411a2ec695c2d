import { percentile, round } from '../stats.js';
import { cgroupCharged } from '../cgroup-memory.js';
import { summarizeLatency, timed } from '../latency.js';
import { addMem, memUsed, settledMeminfo, ZERO_MEM, type MemSnapshot } from '../meminfo.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { createBreakdown, floorBreakdown } from '../breakdown.js';
import { phaseKey, type Spans } from '../profile.js';
import type { ProfileSection } from '../result-types.js';
import { batchSizes, pool, roundOrder } from '../rounds.js';
import { createTargets, renderCreateReport } from './create-report.js';
import { valuesOf, type BenchScenarioDef } from './scenario.js';
import {
  PHASE_SEQUENTIAL,
  PHASE_CONCURRENT,
  PHASE_CONCURRENT_HIGH,
  type CreateScenarioOptions,
  type Throughput,
  type CreateScenarioResult,
} from './create-result.js';

const MAX_ERRORS = 3;

interface PeerState {
  peer: Peer;
  live: string[];
  seq: number[];
  conc: ThroughputState;
  high: ThroughputState;
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
    conc: { lat: [], wall: 0, created: 0 },
    high: { lat: [], wall: 0, created: 0 },
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

  const phase = { active, fail, signal, spans, say, settleMs: opts.settleMs };
  await throughputPhase(phase, batchSizes(opts.count, opts.throughputRounds), opts.concurrency, PHASE_CONCURRENT, (s) => s.conc);
  if (opts.concurrencyHigh > 0)
    await throughputPhase(phase, batchSizes(opts.count, opts.throughputRounds), opts.concurrencyHigh, PHASE_CONCURRENT_HIGH, (s) => s.high);

  const perKiB = (kib: number, n: number): number => (n > 0 ? round(kib / n, 1) : NaN);
  return {
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.peer.description,
      version: s.peer.version,
      sequential: summarizeLatency(s.seq),
      concurrent: throughput(s.conc, opts.concurrency),
      ...(opts.concurrencyHigh > 0 ? { concurrentHigh: throughput(s.high, opts.concurrencyHigh) } : {}),
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
    ops: Object.fromEntries(
      states.map((s) => [s.peer.name, { sequential: s.seq.length, concurrent: s.conc.lat.length, concurrentHigh: s.high.lat.length }]),
    ),
  };
}

interface ThroughputState {
  lat: number[];
  wall: number;
  created: number;
}

function throughput(t: ThroughputState, concurrency: number): Throughput {
  return {
    concurrency,
    created: t.created,
    wallSeconds: round(t.wall, 2),
    createsPerSecond: t.wall > 0 ? round(t.created / t.wall, 1) : NaN,
    latency: summarizeLatency(t.lat),
  };
}

/**
 * `sizes` batches of creates per peer with `concurrency` in flight, peers alternating; each batch
 * is removed untimed, then a pause, so teardown work does not spill into the next peer's batch.
 */
async function throughputPhase(
  ctx: {
    active: () => PeerState[];
    fail: (s: PeerState, what: string, err: unknown) => void;
    signal: AbortSignal;
    spans: Spans;
    say: (m: string) => void;
    settleMs: number;
  },
  sizes: number[],
  concurrency: number,
  phaseName: string,
  into: (s: PeerState) => ThroughputState,
): Promise<void> {
  const { signal, spans, say, fail } = ctx;
  say(`throughput: ${sizes.reduce((a, b) => a + b, 0)} creates per peer, ${concurrency} in flight, in ${sizes.length} alternating rounds…`);
  for (const [r, size] of sizes.entries()) {
    for (const s of roundOrder(ctx.active(), r)) {
      signal.throwIfAborted();
      const t = into(s);
      const ids: string[] = [];
      spans.phase = phaseKey(s.peer.name, phaseName);
      const t0 = performance.now();
      try {
        await pool(size, concurrency, async () => {
          signal.throwIfAborted();
          ids.push(await timed(t.lat, () => s.peer.create()));
        });
        t.wall += (performance.now() - t0) / 1000;
        t.created += size;
      } catch (err) {
        if (signal.aborted) throw err;
        fail(s, `concurrent create (${concurrency} in flight)`, err);
      } finally {
        spans.phase = undefined;
      }
      await pool(ids.length, concurrency, (i) => s.peer.remove(ids[i]!)).catch((err: unknown) =>
        fail(s, 'remove after throughput batch', err),
      );
      await new Promise((res) => setTimeout(res, ctx.settleMs));
    }
    say(`  round ${r + 1}/${sizes.length} done`);
  }
}

function createProfile(result: CreateScenarioResult, spans: Spans): ProfileSection[] {
  const profile: ProfileSection[] = [];
  const dsec = result.peers.find((p) => p.name === 'dsec');
  const crun = result.peers.find((p) => p.name === 'crun');
  const ops = result.ops;
  if (dsec && ops['dsec']) {
    profile.push({
      title: "Where dsec's create time goes (one at a time, mean per create)",
      rows: createBreakdown(spans, phaseKey('dsec', PHASE_SEQUENTIAL), ops['dsec'].sequential, dsec.sequential.mean),
    });
  }
  if (crun && ops['crun']) {
    profile.push({
      title: 'The floor, raw crun, split the same way (one at a time, mean per create)',
      rows: floorBreakdown(spans, phaseKey('crun', PHASE_SEQUENTIAL), ops['crun'].sequential, crun.sequential.mean),
    });
  }
  for (const [t, phase, n] of [
    [dsec?.concurrent, PHASE_CONCURRENT, ops['dsec']?.concurrent],
    [dsec?.concurrentHigh, PHASE_CONCURRENT_HIGH, ops['dsec']?.concurrentHigh],
  ] as const) {
    if (!t || !n) continue;
    profile.push({
      title: `dsec's create time with ${t.concurrency} in flight (mean per create; steps overlap, so shares can exceed 100%)`,
      rows: createBreakdown(spans, phaseKey('dsec', phase), n, t.latency.mean),
    });
  }
  return profile;
}

export const createScenario: BenchScenarioDef<CreateScenarioOptions, CreateScenarioResult> = {
  name: 'create',
  summary: 'create latency (one at a time), throughput (8 and 50 in flight) and host memory per idle sandbox',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'sandboxes per peer, per phase', default: 200, min: 1 },
    { key: 'concurrency', long: 'concurrency', short: 'c', description: 'creates in flight in the throughput phase', default: 8, min: 1 },
    {
      key: 'concurrencyHigh',
      long: 'concurrency-high',
      description: 'creates in flight in a second throughput phase (0: skip)',
      default: 50,
      min: 0,
    },
    { key: 'rounds', long: 'rounds', description: 'alternating rounds of the one-at-a-time phase', default: 8, min: 1 },
    { key: 'throughputRounds', long: 'throughput-rounds', description: 'alternating rounds of each throughput phase', default: 4, min: 1 },
    { key: 'warmup', long: 'warmup', description: 'untimed creates per peer first', default: 5, min: 0 },
    { key: 'settleMs', long: 'settle-ms', description: 'pause before each memory reading (ms)', default: 1000, min: 0 },
  ],
  maxSandboxes: (o) => o.count + Math.max(o.concurrency, o.concurrencyHigh),
  run: runCreateScenario,
  profile: createProfile,
  targets: createTargets,
  render: renderCreateReport,
  lines: (r) =>
    r.peers.map(
      (p) =>
        `${p.name.padEnd(7)} create p50 ${p.sequential.p50} ms  p99 ${p.sequential.p99} ms  ` +
        `${p.concurrent.createsPerSecond} creates/s (${p.concurrent.concurrency} in flight)` +
        (p.concurrentHigh ? `  ${p.concurrentHigh.createsPerSecond}/s (${p.concurrentHigh.concurrency} in flight)` : '') +
        `  ${p.memory.perSandboxMiBMedian} MiB/sandbox`,
    ),
  headline: (r) => {
    const c = r.peers[0]?.concurrent.concurrency;
    const high = r.peers[0]?.concurrentHigh?.concurrency;
    return [
      { metric: 'create p50, one at a time (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.sequential.p50) },
      { metric: `creates/s, ${c} in flight`, better: 'higher', values: valuesOf(r.peers, (p) => p.concurrent.createsPerSecond) },
      ...(high
        ? [
            {
              metric: `creates/s, ${high} in flight`,
              better: 'higher' as const,
              values: valuesOf(r.peers, (p) => p.concurrentHigh?.createsPerSecond ?? NaN),
            },
          ]
        : []),
    ];
  },
};
