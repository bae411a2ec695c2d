import { round } from '../stats.js';
import { renderChart } from '../chart-svg.js';
import { summarizeLatency, timed, type LatencySummary } from '../latency.js';
import type { Peer, PeerUnavailable, SnapshotOps } from '../peers/peer.js';
import { type BenchReport, type PeerResultBase, type ScenarioResult } from '../result-types.js';
import { chartSubtitle, metricsTable, peerBars, renderCommon, type TableMetric } from '../report-common.js';
import { pool, roundOrder } from '../rounds.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import { valuesOf, type BenchScenarioDef, type ScenarioContext } from './scenario.js';

export interface SnapshotOptions {
  /** MiB of random data written to /data.bin before the snapshots. @default 100 */
  dataMiB: number;
  /** Rounds, peers alternating; each takes one snapshot and one restore per peer. @default 5 */
  rounds: number;
  /** Plain creates per peer per round, for the restore-vs-create comparison. @default 2 */
  creates: number;
  /** Sandboxes in the fork. @default 32 */
  fork: number;
}

export interface PeerSnapshotResult extends PeerResultBase {
  /** Writing the data through exec (dd), once (s). */
  writeSeconds: number;
  create: LatencySummary;
  snapshot: LatencySummary;
  /** A sandbox started from a snapshot image, until running. */
  restore: LatencySummary;
  fork: { count: number; wallSeconds: number };
  /** Size of /data.bin in the first restored sandbox and in one forked sandbox (bytes; NaN when not read). */
  restoredBytes: number;
  forkedBytes: number;
}

export interface SnapshotScenarioResult extends ScenarioResult {
  peers: PeerSnapshotResult[];
  /** Bytes /data.bin must have. */
  expectedBytes: number;
}

interface State {
  peer: Peer;
  ops: SnapshotOps;
  source: string;
  write: number;
  create: number[];
  snapshot: number[];
  restore: number[];
  forkWall: number;
  forkCount: number;
  restoredBytes: number;
  forkedBytes: number;
  errors: string[];
}

const MAX_ERRORS = 3;

async function sizeOf(peer: Peer, id: string): Promise<number> {
  return Number((await peer.exec(id, ['stat', '-c', '%s', '/data.bin'])).trim());
}

/**
 * Per peer with snapshots (raw crun has none: reported as not applicable): one sandbox with
 * `dataMiB` written, then rounds, peers alternating, of plain creates, a snapshot and a restore
 * from it; then one fork of `fork` sandboxes. Restored and forked sandboxes are checked for the data.
 */
export async function runSnapshot(peers: Peer[], opts: SnapshotOptions, ctx: ScenarioContext): Promise<SnapshotScenarioResult> {
  const { signal, say } = ctx;
  const dropped: PeerUnavailable[] = [];
  const states: State[] = [];
  const fail = (s: State, what: string, err: unknown): void => {
    s.errors.push(`${what}: ${(err as Error).message}`);
    say(`${s.peer.name}: ${what} failed: ${(err as Error).message}`);
    if (s.errors.length === MAX_ERRORS)
      dropped.push({ name: s.peer.name, reason: `stopped after ${MAX_ERRORS} failures; last: ${s.errors.at(-1)}` });
  };
  const live = (): State[] => states.filter((s) => s.errors.length < MAX_ERRORS);
  for (const peer of peers) {
    if ('unavailable' in peer.snapshots) {
      dropped.push({ name: peer.name, reason: peer.snapshots.unavailable });
      continue;
    }
    say(`${peer.name}: writing ${opts.dataMiB} MiB to /data.bin…`);
    try {
      const source = await peer.create();
      const t = performance.now();
      await peer.exec(source, ['dd', 'if=/dev/urandom', 'of=/data.bin', 'bs=1M', `count=${opts.dataMiB}`]);
      states.push({
        peer,
        ops: peer.snapshots.ops,
        source,
        write: (performance.now() - t) / 1000,
        create: [],
        snapshot: [],
        restore: [],
        forkWall: NaN,
        forkCount: 0,
        restoredBytes: NaN,
        forkedBytes: NaN,
        errors: [],
      });
    } catch (err) {
      dropped.push({ name: peer.name, reason: `could not prepare its sandbox: ${(err as Error).message}` });
    }
  }
  try {
    for (let r = 0; r < opts.rounds; r++) {
      for (const s of roundOrder(live(), r)) {
        signal.throwIfAborted();
        try {
          for (let i = 0; i < opts.creates; i++) await s.peer.remove(await timed(s.create, () => s.peer.create()));
          const image = await timed(s.snapshot, () => s.ops.snapshot(s.source));
          const id = await timed(s.restore, () => s.ops.createFrom(image));
          if (r === 0) s.restoredBytes = await sizeOf(s.peer, id);
          await s.peer.remove(id);
          await s.ops.removeImage(image);
        } catch (err) {
          if (signal.aborted) throw err;
          fail(s, `round ${r + 1}`, err);
        }
      }
      say(`  round ${r + 1}/${opts.rounds} done`);
    }
    for (const s of live()) {
      signal.throwIfAborted();
      say(`${s.peer.name}: fork of ${opts.fork}…`);
      try {
        const t = performance.now();
        const { ids, image } = await s.ops.fork(s.source, opts.fork);
        s.forkWall = (performance.now() - t) / 1000;
        s.forkCount = ids.length;
        if (ids[0]) s.forkedBytes = await sizeOf(s.peer, ids[0]);
        await pool(ids.length, 8, (i) => s.peer.remove(ids[i]!));
        await s.ops.removeImage(image);
      } catch (err) {
        if (signal.aborted) throw err;
        fail(s, 'fork', err);
      }
    }
  } finally {
    for (const s of states) await s.peer.remove(s.source).catch(() => undefined);
  }
  return {
    expectedBytes: opts.dataMiB * 1024 * 1024,
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.ops.description,
      version: s.peer.version,
      errors: s.errors,
      writeSeconds: round(s.write, 2),
      create: summarizeLatency(s.create),
      snapshot: summarizeLatency(s.snapshot),
      restore: summarizeLatency(s.restore),
      fork: { count: s.forkCount, wallSeconds: round(s.forkWall, 2) },
      restoredBytes: s.restoredBytes,
      forkedBytes: s.forkedBytes,
    })),
    dropped,
  };
}

export function snapshotTargets(result: SnapshotScenarioResult): TargetCheck[] {
  const d = result.peers.find((p) => p.name === 'dsec');
  const mib = Math.round(result.expectedBytes / 1048576);
  const snap = check(
    `snapshot of ${TARGETS.snapshotMiB} MB written ≤ ${TARGETS.snapshotMs / 1000} s (p50)`,
    d?.snapshot.p50 ?? NaN,
    TARGETS.snapshotMs,
    'ms',
  );
  const n = d?.fork.count ?? 0;
  const forkBudget = (d?.restore.p50 ?? NaN) * n;
  const restoreBudget = (d?.create.p50 ?? NaN) + TARGETS.restoreOverCreateMs;
  const bytesOk = d ? d.restoredBytes === result.expectedBytes && d.forkedBytes === result.expectedBytes : undefined;
  return [
    mib === TARGETS.snapshotMiB
      ? snap
      : { ...snap, ok: undefined, note: `not judged: ${mib} MiB written, the target is for ${TARGETS.snapshotMiB}` },
    check(`restore p50 ≤ create p50 + ${TARGETS.restoreOverCreateMs} ms`, d?.restore.p50 ?? NaN, restoreBudget, 'ms', {
      measured: d ? `restore ${d.restore.p50} ms vs create ${d.create.p50} ms (budget ${round(restoreBudget, 2)} ms)` : undefined,
    }),
    check(`fork(${n}) ≤ ${n} × restore p50`, (d?.fork.wallSeconds ?? NaN) * 1000, forkBudget, 'ms', {
      measured: d ? `${d.fork.wallSeconds} s vs ${n} × ${d.restore.p50} ms = ${round(forkBudget / 1000, 2)} s` : undefined,
    }),
    {
      target: 'restored and forked sandboxes have the data',
      measured: d ? `/data.bin ${d.restoredBytes} and ${d.forkedBytes} bytes, expected ${result.expectedBytes}` : 'n/a',
      ok: bytesOk,
      note: bytesOk === undefined ? 'not measured' : bytesOk ? 'met' : 'wrong size: the snapshot lost data',
    },
  ];
}

const METRICS: TableMetric<PeerSnapshotResult>[] = [
  { name: 'write the data with dd through exec (s, once)', get: (p) => p.writeSeconds },
  { name: 'snapshot p50 (ms)', get: (p) => p.snapshot.p50 },
  { name: 'snapshot max (ms)', get: (p) => p.snapshot.max },
  { name: 'restore p50: sandbox from the snapshot (ms)', get: (p) => p.restore.p50 },
  { name: 'restore max (ms)', get: (p) => p.restore.max },
  { name: 'plain create p50, same run (ms)', get: (p) => p.create.p50 },
  { name: 'restore p50 − create p50 (ms)', get: (p) => round(p.restore.p50 - p.create.p50, 2) },
  { name: 'fork: wall time for all (s)', get: (p) => p.fork.wallSeconds },
  { name: 'fork: sandboxes started', get: (p) => p.fork.count },
];

export function renderSnapshot(report: BenchReport<SnapshotScenarioResult>, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as SnapshotOptions;
  const bars = (get: (p: PeerSnapshotResult) => number): ReturnType<typeof peerBars> => peerBars(result.peers, get);
  const svg = renderChart(`dsec bench snapshot — ${report.startedAt}`, chartSubtitle(report), [
    {
      title: `snapshot of a sandbox with ${o.dataMiB} MiB written, p50`,
      unit: 'ms',
      better: 'lower',
      bars: bars((p) => p.snapshot.p50),
      target: { value: TARGETS.snapshotMs, label: `target ${TARGETS.snapshotMs / 1000} s` },
    },
    { title: 'restore (sandbox from the snapshot), p50', unit: 'ms', better: 'lower', bars: bars((p) => p.restore.p50) },
    { title: 'plain create, p50 (same run)', unit: 'ms', better: 'lower', bars: bars((p) => p.create.p50) },
    { title: `fork of ${o.fork}, wall time`, unit: 's', better: 'lower', bars: bars((p) => p.fork.wallSeconds) },
  ]);
  const md = [
    `# dsec bench snapshot — ${report.startedAt}`,
    '',
    `Per peer, one busybox sandbox with ${o.dataMiB} MiB of random data written to /data.bin (\`dd if=/dev/urandom\` through exec). ` +
      `Then ${o.rounds} rounds, peers alternating: ${o.creates} plain creates, a snapshot of that sandbox, a sandbox started ` +
      `from the snapshot (restore; the first one's /data.bin size is checked), both removed. Last, one fork of ${o.fork} ` +
      'sandboxes from the same sandbox (one of them checked), wall time.',
    '',
    metricsTable(result.peers, METRICS),
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const snapshotScenario: BenchScenarioDef<SnapshotOptions, SnapshotScenarioResult> = {
  name: 'snapshot',
  summary: 'snapshot of a sandbox with 100 MB written, restore from it, fork of 32 (raw crun: not applicable)',
  flags: [
    { key: 'dataMiB', long: 'data-mib', description: 'MiB written to /data.bin before snapshotting', default: 100, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'snapshot + restore rounds, peers alternating', default: 5, min: 1 },
    { key: 'creates', long: 'creates', description: 'plain creates per peer per round (restore is compared to them)', default: 2, min: 1 },
    { key: 'fork', long: 'fork', description: 'sandboxes in the fork', default: 32, min: 1 },
  ],
  maxSandboxes: (o) => o.fork + 8,
  run: runSnapshot,
  targets: snapshotTargets,
  render: renderSnapshot,
  lines: (r) =>
    r.peers.map(
      (p) =>
        `${p.name.padEnd(7)} snapshot p50 ${p.snapshot.p50} ms  restore p50 ${p.restore.p50} ms (create ${p.create.p50} ms)  ` +
        `fork(${p.fork.count}) ${p.fork.wallSeconds} s  data ${p.restoredBytes === r.expectedBytes ? 'ok' : `WRONG (${p.restoredBytes})`}`,
    ),
  headline: (r) => [
    { metric: 'snapshot p50 (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.snapshot.p50) },
    { metric: 'restore p50 (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.restore.p50) },
    {
      metric: `fork(${r.peers[0]?.fork.count ?? '?'}) wall time (s)`,
      better: 'lower',
      values: valuesOf(r.peers, (p) => p.fork.wallSeconds),
    },
  ],
};
