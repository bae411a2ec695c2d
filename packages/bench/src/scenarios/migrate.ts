/**
 * `dsec bench migrate` (issue 33): sandboxes moved between two real `dsec edge` daemons (crun, and
 * QEMU for the microVM) under a `dsec control`, all child processes on loopback, started the way
 * the cluster scenario's real run starts them (cluster-processes.ts). Measured through the SDK as
 * an operator and a trainer see it: idle containers with a little and a lot written, a microVM,
 * what a caller polling the sandbox sees during a move, and a drain with migrate. Every move is
 * checked: the sandbox's row names the other edge, and its data reads back with the same checksum.
 * Options and result: migrate-result.ts; targets and rendering: migrate-report.ts.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { ConflictError, Connection, readNdjson, Sandbox, type MigrateResult as ApiMigrateResult } from '@dsec/sdk';
import type { DrainProgress } from '@dsec/sdk/schema';
import { vmCheck } from 'dsec/runtime';
import { startControlChild, startEdgeChild, waitForEdges, type BenchChild } from '../cluster-processes.js';
import { BENCH_IMAGE } from '../fixture.js';
import { summarizeLatency } from '../latency.js';
import type { Peer } from '../peers/peer.js';
import { pool } from '../rounds.js';
import { percentile, round } from '../stats.js';
import { migrateHeadline, migrateLines, migrateTargets, renderMigrate } from './migrate-report.js';
import type { DowntimeRun, DrainFigures, MigrateOptions, MigrateResult, MoveRecord, MoveSet, PolledMove } from './migrate-result.js';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';

/** The run's own dir under the bench temp dir; sweep.ts knows it (crun roots of its edges). */
export const MIGRATE_DIR = 'migrate';

const LAYOUT =
  'three child processes of the benchmark: `dsec control` and two `dsec edge` daemons, each with its own data dir, joined over loopback HTTP; ' +
  "layers and packed state go through the control plane's blob endpoint, as between machines. All on this host's cores, so a move shares them with both edges and the control plane.";

const CONTAINER_MIB = 128;
const LONG = { timeoutMs: 600_000 };

type Conn = { url: string; apiKey: string };

function container(conn: Conn, labels: Record<string, string>): Promise<Sandbox> {
  return Sandbox.create({
    ...conn,
    image: BENCH_IMAGE,
    resources: { memoryMiB: CONTAINER_MIB, pids: 512, cpu: 1 },
    labels,
    timeoutMs: 120_000,
  });
}

async function sh(sb: Sandbox, cmd: string): Promise<string> {
  const r = await sb.commands.run(cmd, LONG);
  if (r.exitCode !== 0) throw new Error(`${cmd} in ${sb.id} exited ${r.exitCode}: ${r.stderr.trim()}`);
  return r.stdout;
}

/** `mib` MiB of random bytes at `path`; its md5. */
async function writeData(sb: Sandbox, path: string, mib: number): Promise<string> {
  await sh(sb, `dd if=/dev/urandom of=${path} bs=1M count=${mib} 2>/dev/null`);
  return sh(sb, `md5sum ${path} | cut -d' ' -f1`);
}

/** A move as the caller makes it, timed as it waited; `edge` names the target (else placement picks the other). */
async function timedMove(sb: Sandbox, edge?: string): Promise<{ r: ApiMigrateResult; callMs: number }> {
  const t = performance.now();
  const r = await sb.migrate(edge ? { edge } : {});
  return { r, callMs: performance.now() - t };
}

/** Whether the row names the new edge (and not the old one). */
async function edgeChanged(sb: Sandbox, r: ApiMigrateResult): Promise<boolean> {
  const info = await sb.refresh();
  return r.to !== r.from && info.edge === r.to && info.status !== 'failed';
}

function moveSet(
  label: string,
  backend: MoveSet['backend'],
  writtenMib: number,
  memoryMiB: number,
  moves: MoveRecord[],
  errors: string[],
): MoveSet {
  return {
    label,
    backend,
    writtenMib,
    memoryMiB,
    moves,
    ms: summarizeLatency(moves.map((m) => m.ms)),
    heldMs: summarizeLatency(moves.map((m) => m.heldMs)),
    callMs: summarizeLatency(moves.map((m) => m.callMs)),
    bytesP50: moves.length
      ? percentile(
          moves.map((m) => m.bytes),
          50,
        )
      : 0,
    verified: moves.filter((m) => m.edgeChanged && m.intact).length,
    errors,
  };
}

function record(sb: Sandbox, r: ApiMigrateResult, callMs: number, changed: boolean, intact: boolean): MoveRecord {
  return {
    id: sb.id,
    from: r.from,
    to: r.to,
    ms: r.ms,
    heldMs: r.heldMs,
    callMs: round(callMs, 1),
    bytes: r.bytes,
    edgeChanged: changed,
    intact,
  };
}

/** `rounds` fresh containers, each with `mib` MiB written, each moved once (to the other edge) and checked. */
async function containerMoves(
  conn: Conn,
  labels: Record<string, string>,
  mib: number,
  rounds: number,
  ctx: ScenarioContext,
): Promise<MoveSet> {
  const moves: MoveRecord[] = [];
  const errors: string[] = [];
  for (let i = 0; i < rounds && errors.length < 3; i++) {
    ctx.signal.throwIfAborted();
    let sb: Sandbox | undefined;
    try {
      sb = await container(conn, labels);
      const sum = await writeData(sb, '/root/data', mib);
      const { r, callMs } = await timedMove(sb);
      const changed = await edgeChanged(sb, r);
      const after = await sh(sb, 'md5sum /root/data | cut -d" " -f1');
      const problem = after === sum ? undefined : `md5 ${after.trim()} after the move, ${sum.trim()} before`;
      moves.push({ ...record(sb, r, callMs, changed, !problem), ...(problem ? { problem } : {}) });
      ctx.say(`  ${mib} MiB: ${r.from} → ${r.to} in ${r.ms} ms (held ${r.heldMs} ms, ${round(r.bytes / 2 ** 20, 1)} MiB moved)`);
    } catch (err) {
      errors.push((err as Error).message);
      ctx.say(`  ${mib} MiB: move failed: ${(err as Error).message}`);
    } finally {
      await sb?.kill().catch(() => undefined);
    }
  }
  return moveSet(`container, ${mib} MiB written`, 'container', mib, CONTAINER_MIB, moves, errors);
}

/** One microVM (`memoryMiB` of guest memory, 32 MiB of it a tmpfs file, a counting process), moved back and forth `rounds` times. */
async function vmMoves(
  conn: Conn,
  labels: Record<string, string>,
  memoryMiB: number,
  rounds: number,
  edges: string[],
  ctx: ScenarioContext,
): Promise<MoveSet> {
  const moves: MoveRecord[] = [];
  const errors: string[] = [];
  const dataMib = 32;
  const sb = await Sandbox.create({
    ...conn,
    image: BENCH_IMAGE,
    backend: 'microvm',
    resources: { memoryMiB, pids: 512, cpu: 1 },
    labels,
    timeoutMs: 600_000,
  });
  try {
    const sum = await writeData(sb, '/dev/shm/noise', dataMib);
    await sb.commands.start(['sh', '-c', 'i=0; while true; do i=$((i+1)); echo $i > /dev/shm/count; sleep 0.2; done']);
    // The same process counting on: the counter goes up across a second, from where it was, not from 0.
    const check = async (before: number): Promise<{ ok: boolean; count: number; problem?: string }> => {
      const raw = await sh(
        sb,
        "a=$(cat /dev/shm/count); sleep 1; b=$(cat /dev/shm/count); echo $a $b; md5sum /dev/shm/noise | cut -d' ' -f1",
      );
      const out = raw.trim().split(/\s+/);
      const [a, b] = [Number(out[0]), Number(out[1])];
      const ok = b > a && a >= before && out[2] === sum.trim();
      return ok ? { ok, count: b } : { ok, count: b, problem: `counter ${a} → ${b} (was ${before}), md5 ${out[2]} vs ${sum.trim()}` };
    };
    let count = (await check(0)).count;
    for (let i = 0; i < rounds && errors.length < 3; i++) {
      ctx.signal.throwIfAborted();
      const to = edges.find((e) => e !== sb.info.edge)!;
      try {
        const { r, callMs } = await timedMove(sb, to);
        const changed = await edgeChanged(sb, r);
        const c = await check(count);
        count = c.count;
        moves.push({ ...record(sb, r, callMs, changed, c.ok), ...(c.problem ? { problem: c.problem } : {}) });
        ctx.say(
          `  microVM: ${r.from} → ${r.to} in ${r.ms} ms (held ${r.heldMs} ms, state ${round(r.bytes / 2 ** 20, 1)} MiB)${c.ok ? '' : ` — CHECK FAILED: ${c.problem}`}`,
        );
      } catch (err) {
        errors.push((err as Error).message);
        ctx.say(`  microVM: move failed: ${(err as Error).message}`);
      }
    }
  } finally {
    await sb.kill().catch(() => undefined);
  }
  return moveSet(
    `microVM, ${memoryMiB} MiB guest memory (${dataMib} MiB of it random data in tmpfs)`,
    'microvm',
    dataMib,
    memoryMiB,
    moves,
    errors,
  );
}

/** Calls `call` every `periodMs` (or at once when it took longer) until stopped; the times of its successful answers, its failures. */
function poller(
  call: () => Promise<void>,
  periodMs: number,
): { stop: () => Promise<{ answers: number[]; slowest: number; failures: string[] }> } {
  const answers: number[] = [];
  const failures: string[] = [];
  let slowest = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const t0 = performance.now();
      try {
        await call();
        const t1 = performance.now();
        answers.push(t1);
        slowest = Math.max(slowest, t1 - t0);
      } catch (err) {
        failures.push((err as Error).message);
      }
      const wait = t0 + periodMs - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
      return { answers, slowest, failures };
    },
  };
}

function longestGap(answers: number[]): number {
  let gap = 0;
  for (let i = 1; i < answers.length; i++) gap = Math.max(gap, answers[i]! - answers[i - 1]!);
  return round(gap, 1);
}

/**
 * A caller polling one sandbox every `pollMs` with `kind` while it moves, `moves` times back and
 * forth, `smallMib` MiB written afresh before each move: the longest time without an answer, and every failed call. A `true`
 * running at the quiesce makes the move refused (SANDBOX_NOT_MIGRATABLE): it is tried again, counted.
 */
async function polledMoves(
  conn: Conn,
  labels: Record<string, string>,
  kind: DowntimeRun['kind'],
  opts: MigrateOptions,
  ctx: ScenarioContext,
): Promise<DowntimeRun> {
  const sb = await container(conn, labels);
  const moves: PolledMove[] = [];
  const failures: string[] = [];
  try {
    await sb.files.write('/root/ping', 'pong\n');
    const call =
      kind === 'exec true'
        ? async (): Promise<void> => {
            const r = await sb.commands.run('true');
            if (r.exitCode !== 0)
              throw new Error(
                `true exited ${r.exitCode}${r.exitCode === 137 ? ' (SIGKILL: the call was let through and its process killed by the move)' : ''}`,
              );
          }
        : async (): Promise<void> => {
            const text = await sb.files.readText('/root/ping');
            if (text !== 'pong\n') throw new Error(`/root/ping read ${JSON.stringify(text)}`);
          };
    for (let i = 0; i < opts.pollMoves; i++) {
      ctx.signal.throwIfAborted();
      // Written afresh before each move (untimed), so each carries smallMib MiB: what moved before is in a lower layer now.
      const sum = await writeData(sb, '/root/data', opts.smallMib);
      const p = poller(call, opts.pollMs);
      await new Promise((r) => setTimeout(r, 500));
      let refused = 0;
      let moved: { r: ApiMigrateResult; callMs: number } | undefined;
      for (;;) {
        try {
          moved = await timedMove(sb);
          break;
        } catch (err) {
          if (!(err instanceof ConflictError && err.code === 'SANDBOX_NOT_MIGRATABLE') || refused >= 100) {
            await p.stop();
            throw err;
          }
          refused++;
        }
      }
      await new Promise((r) => setTimeout(r, 500));
      const seen = await p.stop();
      const changed = await edgeChanged(sb, moved.r);
      const intact = (await sh(sb, 'md5sum /root/data | cut -d" " -f1')) === sum;
      failures.push(...seen.failures);
      const m: PolledMove = {
        from: moved.r.from,
        to: moved.r.to,
        ms: moved.r.ms,
        heldMs: moved.r.heldMs,
        longestGapMs: longestGap(seen.answers),
        slowestCallMs: round(seen.slowest, 1),
        calls: seen.answers.length + seen.failures.length,
        failed: seen.failures.length,
        refused,
        edgeChanged: changed,
        intact,
      };
      moves.push(m);
      ctx.say(
        `  ${kind} every ${opts.pollMs} ms: ${m.from} → ${m.to} held ${m.heldMs} ms, longest gap ${m.longestGapMs} ms, ${m.calls} calls, ${m.failed} failed${refused ? `, ${refused} refused` : ''}`,
      );
    }
  } finally {
    await sb.kill().catch(() => undefined);
  }
  return {
    kind,
    moves,
    longestGapMs: summarizeLatency(moves.map((m) => m.longestGapMs)),
    calls: moves.reduce((a, m) => a + m.calls, 0),
    failed: failures.length,
    failures: [...new Set(failures)].slice(0, 10),
    refused: moves.reduce((a, m) => a + m.refused, 0),
  };
}

/**
 * `count` idle sandboxes (each with a file naming it) gathered on edge `victim` (those placed on
 * the other edge moved there first, timed apart), then `POST /v1/nodes/{victim}/drain {migrate:
 * true}` read as NDJSON to its last line; every moved sandbox checked on the other edge.
 */
async function drainMoves(
  conn: Conn,
  labels: Record<string, string>,
  count: number,
  victim: string,
  keeper: string,
  ctx: ScenarioContext,
): Promise<DrainFigures> {
  const { say } = ctx;
  const errors: string[] = [];
  const made = await Sandbox.createMany(count, {
    ...conn,
    image: BENCH_IMAGE,
    resources: { memoryMiB: 32, pids: 64, cpu: 0.1 },
    labels: { ...labels, phase: 'drain' },
    concurrency: 8,
  });
  const sandboxes = made.sandboxes;
  try {
    for (const f of made.failures) errors.push(`create: ${f.code} ${f.reason}`);
    if (sandboxes.length < count)
      throw new Error(`only ${sandboxes.length} of ${count} sandboxes started: ${errors.slice(0, 3).join('; ')}`);
    await pool(sandboxes.length, 8, async (i) => void (await sandboxes[i]!.files.write('/root/who', sandboxes[i]!.id)));
    const elsewhere = sandboxes.filter((s) => s.info.edge !== victim);
    say(`  ${count} created; ${elsewhere.length} placed on ${keeper} move to ${victim} first (4 at a time)…`);
    const fill: number[] = [];
    await pool(elsewhere.length, 4, async (i) => {
      const r = await elsewhere[i]!.migrate({ edge: victim });
      fill.push(r.ms);
    });
    ctx.signal.throwIfAborted();
    say(`  draining ${victim} with migrate (${count} sandboxes)…`);
    const c = new Connection(conn);
    const t0 = performance.now();
    const res = await c.request('POST', `/v1/nodes/${victim}/drain`, {
      json: { migrate: true },
      accept: 'application/x-ndjson',
      timeoutMs: 1_800_000,
    });
    const lines: DrainProgress[] = [];
    try {
      for await (const line of readNdjson<DrainProgress>(res.body!)) lines.push(line);
    } catch (err) {
      errors.push(`the drain's progress ended early: ${(err as Error).message}`);
    }
    const totalMs = performance.now() - t0;
    const movedLines = lines.flatMap((l) => (l.type === 'moved' ? [l] : []));
    const done = lines.find((l) => l.type === 'done');
    const stayed = lines.flatMap((l) => (l.type === 'stayed' ? [{ id: l.id, code: l.code, reason: l.reason }] : []));
    let verified = 0;
    const byId = new Map(sandboxes.map((s) => [s.id, s]));
    await pool(movedLines.length, 8, async (i) => {
      const sb = byId.get(movedLines[i]!.id);
      if (!sb) return;
      try {
        const info = await sb.refresh();
        const who = await sb.files.readText('/root/who');
        if (info.edge === keeper && info.edge === movedLines[i]!.to && who === sb.id) verified++;
        else errors.push(`${sb.id}: on ${info.edge}, /root/who ${JSON.stringify(who)}`);
      } catch (err) {
        errors.push(`${sb.id}: ${(err as Error).message}`);
      }
    });
    return {
      count,
      fillMoves: fill.length,
      fillMs: summarizeLatency(fill),
      totalMs: round(totalMs, 1),
      perMove: summarizeLatency(movedLines.map((l) => l.ms)),
      moved: movedLines.length,
      stayed,
      nodeState: done?.type === 'done' ? done.node.state : 'no done line (the stream ended first)',
      verified,
      errors: errors.slice(0, 10),
    };
  } finally {
    await pool(sandboxes.length, 8, async (i) => void (await sandboxes[i]!.kill().catch(() => undefined)));
  }
}

export async function runMigrate(peers: Peer[], opts: MigrateOptions, ctx: ScenarioContext): Promise<MigrateResult> {
  const { names, say, signal } = ctx;
  const aio = peers.find((p) => p.name === 'dsec');
  const dir = join(names.dir, MIGRATE_DIR);
  mkdirSync(dir, { recursive: true });
  const children: BenchChild[] = [];
  const labels = { bench: names.id };
  say(`dsec control + 2 dsec edge daemons on loopback, data under ${dir}…`);
  const control = await startControlChild(join(dir, 'control'));
  try {
    const edges = [1, 2].map((k) => `${names.edgeId}m${k}`);
    for (const [k, id] of edges.entries()) {
      const e = await startEdgeChild({
        join: control.url,
        token: control.joinToken,
        id,
        dataDir: join(dir, `edge${k + 1}`),
        maxSandboxes: Math.max(50, opts.drainCount + 20),
      });
      children.push(e.child);
    }
    await waitForEdges(control.url, control.apiKey, edges);
    const conn = { url: control.url, apiKey: control.apiKey };

    // Warm-up: one sandbox moved there and back, so each edge has busybox and the code paths are warm.
    say('warm-up: one container moved to the other edge and back…');
    {
      const sb = await container(conn, labels);
      try {
        await writeData(sb, '/root/data', 1);
        await sb.migrate();
        await sb.migrate();
      } finally {
        await sb.kill().catch(() => undefined);
      }
    }

    const containers: MoveSet[] = [];
    for (const mib of [opts.smallMib, opts.largeMib]) {
      say(`idle container with ${mib} MiB written: ${opts.rounds} moves, a fresh sandbox each…`);
      containers.push(await containerMoves(conn, labels, mib, opts.rounds, ctx));
    }

    const downtime: DowntimeRun[] = [];
    if (opts.pollMoves > 0)
      for (const kind of ['exec true', 'file read'] as const) {
        say(`a caller polling with ${kind} every ${opts.pollMs} ms during ${opts.pollMoves} moves…`);
        downtime.push(await polledMoves(conn, labels, kind, opts, ctx));
      }

    let vm: MigrateResult['vm'];
    let vmAccel: string | undefined;
    if (opts.vmMemoryMib === 0 || opts.vmRounds === 0) vm = { unavailable: 'skipped (--vm-memory-mib 0 or --vm-rounds 0)' };
    else {
      const check = await vmCheck();
      if (!check.ok) vm = { unavailable: `microVMs cannot run here: ${check.detail}` };
      else {
        vmAccel = check.detail;
        say(`microVM with ${opts.vmMemoryMib} MiB (${check.detail.split(' ')[0]}): boot, then ${opts.vmRounds} moves back and forth…`);
        try {
          vm = await vmMoves(conn, labels, opts.vmMemoryMib, opts.vmRounds, edges, ctx);
        } catch (err) {
          if (signal.aborted) throw err;
          vm = { unavailable: `the microVM run failed: ${(err as Error).message}` };
          say(`  ${vm.unavailable}`);
        }
      }
    }

    let drain: MigrateResult['drain'] = { unavailable: 'skipped (--drain-count 0)' };
    if (opts.drainCount > 0) {
      say(`drain with migrate of an edge holding ${opts.drainCount} idle sandboxes…`);
      drain = await drainMoves(conn, labels, opts.drainCount, edges[0]!, edges[1]!, ctx);
      say(
        `  ${drain.moved} moved in ${drain.totalMs} ms, per move p50 ${drain.perMove.p50} ms; ${drain.stayed.length} stayed; ${drain.verified} verified`,
      );
    }

    const errors = [
      ...containers.flatMap((s) => s.errors),
      ...('moves' in vm ? vm.errors : []),
      ...downtime.flatMap((d) => d.failures),
      ...('errors' in drain ? drain.errors : []),
    ];
    return {
      peers: [
        {
          name: 'dsec',
          description:
            'sandbox.migrate() through the SDK against dsec control + 2 × dsec edge (child processes, loopback); drain: POST /v1/nodes/{id}/drain {migrate: true} as NDJSON',
          version: aio?.version ?? 'dsec',
          errors,
        },
      ],
      dropped: [],
      edges,
      layout: LAYOUT,
      containers,
      vm,
      ...(vmAccel ? { vmAccel } : {}),
      downtime,
      drain,
    };
  } finally {
    for (const c of children.reverse()) await c.stop();
    await control.child.stop();
  }
}

export const migrateScenario: BenchScenarioDef<MigrateOptions, MigrateResult> = {
  name: 'migrate',
  summary:
    'sandboxes moved between 2 real edges (issue 33): idle containers, a microVM, downtime seen by a polling caller, a drain with migrate',
  flags: [
    { key: 'rounds', long: 'rounds', short: 'r', description: 'moves timed per container size (a fresh sandbox each)', default: 5, min: 1 },
    { key: 'smallMib', long: 'small-mib', description: 'MiB written into the small container', default: 10, min: 1 },
    { key: 'largeMib', long: 'large-mib', description: 'MiB written into the large container', default: 500, min: 1 },
    { key: 'vmMemoryMib', long: 'vm-memory-mib', description: "the microVM's guest memory (0: skip the VM)", default: 256, min: 0 },
    { key: 'vmRounds', long: 'vm-rounds', description: 'moves of the microVM, back and forth', default: 3, min: 0 },
    { key: 'pollMoves', long: 'poll-moves', description: 'moves under a polling caller, per poll kind (0: skip)', default: 5, min: 0 },
    { key: 'pollMs', long: 'poll-ms', description: "the polling caller's period (ms)", default: 50, min: 1 },
    {
      key: 'drainCount',
      long: 'drain-count',
      description: 'idle sandboxes on the edge drained with migrate (0: skip)',
      default: 100,
      min: 0,
    },
  ],
  maxSandboxes: () => 10,
  run: runMigrate,
  targets: migrateTargets,
  render: renderMigrate,
  lines: migrateLines,
  headline: migrateHeadline,
};
