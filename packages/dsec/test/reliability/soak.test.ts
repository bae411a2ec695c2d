/**
 * Soak: N create → mixed work → kill cycles on a real `dsec up` of its own (a child process, so
 * its memory is dsec's alone, not the test's SDK client and bookkeeping), then a leak census
 * against the one taken after a warm-up: no mount, cgroup, netns, veth, nftables table or sandbox
 * process may be left, the dsec process's fds and children must not grow, and its RSS growth
 * (after a full GC in it: dsec-up-measured.ts) is reported.
 *
 * The work per cycle is soak-cycle.ts's. Snapshot images are unnamed, so each must be deleted
 * with its sandboxes: the image list must end as it began, and an image GC at the end must find
 * no more layers in use than at the start.
 *
 * CI runs 100 cycles (two at a time). DSEC_SOAK=1 runs 10,000 and also asserts RSS grew < 10 %;
 * DSEC_SOAK_CYCLES and DSEC_SOAK_CONCURRENCY override. Every DSEC_SOAK_CHECKPOINT_EVERY cycles
 * (1,000 long, 25 in CI) the run drains and takes a checkpoint: RSS after a GC, fds, the census
 * against the start (`checkpoints` in the result, a `soak checkpoint:` line each as it goes).
 * Results go to stdout as one JSON line (`soak result: {...}`) and, with DSEC_SOAK_RESULTS=FILE,
 * to that file. To look into dsec's memory: DSEC_SOAK_SMAPS_DIR=DIR keeps its /proc/<pid>/smaps
 * at each checkpoint, DSEC_SOAK_HEAP_SNAPSHOTS=DIR a V8 heap snapshot (writing one holds on to
 * ~100 MiB of native memory: RSS is then not comparable).
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Image, Sandbox } from '@dsec/sdk';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { census, leaked, type Census } from './census.js';
import { pollUntil } from '../engine/support/sandbox-procs.js';
import { DsecUpChild } from './dsec-up-child.js';
import type { MemoryReport } from './dsec-up-measured.js';
import { soakCycle } from './soak-cycle.js';
import { smapsGrowth, summariseSmaps, type SmapsSummary } from './smaps-summary.js';

const long = process.env['DSEC_SOAK'] === '1';
const cycles = Number(process.env['DSEC_SOAK_CYCLES'] ?? (long ? 10_000 : 100));
const concurrency = Number(process.env['DSEC_SOAK_CONCURRENCY'] ?? 2);
const warmup = Math.max(2, Math.min(50, Math.floor(cycles / 20)));
/** Cycles between checkpoints (memory after a GC, fds, census), counted from cycle 0. */
const checkpointEvery = Number(process.env['DSEC_SOAK_CHECKPOINT_EVERY'] ?? (long ? 1000 : 25));
const MEASURED = new URL('./dsec-up-measured.js', import.meta.url).pathname;

describe(`soak: ${cycles} create → work → kill cycles`, { skip: integrationSkipReason(), timeout: long ? 24 * 3600_000 : 900_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let up: DsecUpChild | undefined;
  const conn = () => ({ url: up!.conn.url, apiKey: up!.conn.apiKey });
  const failures: string[] = [];
  const made: string[] = [];
  /** When each cycle ended (performance.now()), in order: throughput by tenth of the run. */
  const ended: number[] = [];

  let reportFile = '';
  before(async () => {
    dataDir = makeDataDir();
    reportFile = join(dataDir, 'memory-report.json');
    await (await startDsec(dataDir, { edgeId })).close(); // builds the busybox image, in this process
    // As ./dsec starts it (MALLOC_ARENA_MAX=2 unless the caller sets one).
    const env: Record<string, string> = { DSEC_MEMORY_REPORT: reportFile, MALLOC_ARENA_MAX: process.env['MALLOC_ARENA_MAX'] ?? '2' };
    if (process.env['DSEC_SOAK_HEAP_SNAPSHOTS']) env['DSEC_MEMORY_HEAP_SNAPSHOTS'] = process.env['DSEC_SOAK_HEAP_SNAPSHOTS'];
    up = new DsecUpChild(dataDir, edgeId, { entry: MEASURED, env });
    await up.start();
  });
  after(async () => {
    if (up?.running) {
      await Promise.allSettled((await Sandbox.list(conn())).map(async (sb) => (await Sandbox.connect(sb.id, conn())).kill()));
      await up.stop();
    }
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  /** dsec's memory after a full GC in its process (dsec-up-measured.ts answers SIGUSR2). */
  async function measure(): Promise<MemoryReport & { smaps: SmapsSummary }> {
    rmSync(reportFile, { force: true });
    process.kill(up!.pid!, 'SIGUSR2');
    // A heap snapshot (DSEC_SOAK_HEAP_SNAPSHOTS) takes a while more.
    for (let i = 0; i < 6000 && !existsSync(reportFile); i++) await new Promise((r) => setTimeout(r, 20));
    // Read right after the GC, before the next cycle's allocations.
    const smaps = readFileSync(`/proc/${up!.pid!}/smaps`, 'utf8');
    const smapsDir = process.env['DSEC_SOAK_SMAPS_DIR'];
    if (smapsDir) writeFileSync(join(smapsDir, `smaps-${Date.now()}.txt`), smaps);
    return { ...(JSON.parse(readFileSync(reportFile, 'utf8')) as MemoryReport), smaps: summariseSmaps(smaps) };
  }

  async function run(from: number, to: number): Promise<void> {
    let next = from;
    const worker = async (): Promise<void> => {
      while (next < to) {
        const i = next++;
        try {
          await soakCycle(conn(), i, { created: (id) => made.push(id) });
        } catch (err) {
          failures.push(`cycle ${i}: ${(err as Error).message}`);
        }
        ended.push(performance.now());
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
  }

  /** Each resident helper (a direct child of dsec) by name and pid, with its open fds now. */
  function helperFds(c: Census): Record<string, number> {
    const out: Record<string, number> = {};
    for (const pid of c.children) {
      try {
        out[`${readFileSync(`/proc/${pid}/comm`, 'utf8').trim()} ${pid}`] = readdirSync(`/proc/${pid}/fd`).length;
      } catch {
        // exited meanwhile
      }
    }
    return out;
  }

  /** Where the run stands after `cycle` cycles: dsec's memory and fds, and what leaked since `start`. */
  function checkpoint(cycle: number, t0: number, memory: MemoryReport, start: Census, now: Census) {
    return {
      cycle,
      seconds: Math.round((performance.now() - t0) / 100) / 10,
      failures: failures.length,
      rssMiB: Math.round((memory.rssBytes / 2 ** 20) * 10) / 10,
      heapUsedMiB: memory.heapUsedMiB,
      anonymousMiB: memory.detailMiB['anonymous'],
      fds: now.fds,
      helperFds: now.childFds,
      helpers: helperFds(now),
      leaked: leaked(start, now),
      loadAverage: loadavg().map((l) => Math.round(l * 10) / 10),
    };
  }

  test('every cycle succeeds and nothing leaks', async () => {
    await run(0, warmup);
    const memoryStart = await measure();
    const start: Census = census(dataDir, edgeId, made, up!.pid);
    const imagesStart = (await Image.list(conn())).map((im) => im.id);
    const layersInUseStart = (await Image.gc(conn())).keptInUse;
    const t0 = performance.now();
    const firstMeasured = ended.length;
    // The run stops at each checkpoint (the cycles in flight end first), so that its census sees
    // no sandbox of the load and its RSS no work half done.
    const checkpoints = [checkpoint(warmup, t0, memoryStart, start, start)];
    let memoryEnd = memoryStart;
    let end = start;
    for (let from = warmup; from < cycles;) {
      const to = Math.min(cycles, (Math.floor(from / checkpointEvery) + 1) * checkpointEvery);
      await run(from, to);
      memoryEnd = await measure();
      end = census(dataDir, edgeId, made, up!.pid);
      checkpoints.push(checkpoint(to, t0, memoryEnd, start, end));
      console.log(`soak checkpoint: ${JSON.stringify(checkpoints.at(-1))}`);
      from = to;
    }
    const seconds = (performance.now() - t0) / 1000;
    // dsec-spawn holds ~13 fds for a command it is starting or ending, after the API has answered:
    // a census can catch one or two (seen: 6 → 19 or 32 at one checkpoint, 6 again at the next).
    // Counted again until those are done; a leak stays and fails below.
    await pollUntil(
      () => {
        end = census(dataDir, edgeId, made, up!.pid);
        return end.childFds - start.childFds < 32;
      },
      { tries: 50, intervalMs: 200 },
    );
    const imagesLeft = (await Image.list(conn())).map((im) => im.id).filter((id) => !imagesStart.includes(id));
    const gcEnd = await Image.gc(conn());
    const result = {
      cycles,
      concurrency,
      measuredCycles: cycles - warmup,
      seconds: Math.round(seconds * 10) / 10,
      cyclesPerSecond: Math.round(((cycles - warmup) / seconds) * 100) / 100,
      // A cost that grows with the sandboxes made so far (a list, a table scan) shows as a slowing.
      cyclesPerSecondByTenth: byTenth(ended.slice(firstMeasured), t0),
      failures: failures.length,
      leaked: leaked(start, end),
      fds: { start: start.fds, end: end.fds },
      helperFds: { start: start.childFds, end: end.childFds },
      rssMiB: { start: Math.round(memoryStart.rssBytes / 2 ** 20), end: Math.round(memoryEnd.rssBytes / 2 ** 20) },
      rssGrowthPercent: Math.round(((memoryEnd.rssBytes - memoryStart.rssBytes) / memoryStart.rssBytes) * 1000) / 10,
      heapUsedMiB: { start: memoryStart.heapUsedMiB, end: memoryEnd.heapUsedMiB },
      memoryMiB: { start: memoryStart.detailMiB, end: memoryEnd.detailMiB },
      // Which kind of mapping the resident memory went to (smaps-summary.ts): V8 pages, malloc arenas, stacks…
      rssGrowthByMapping: smapsGrowth(memoryStart.smaps, memoryEnd.smaps),
      sandboxesLeft: (await Sandbox.list(conn())).length,
      // Killed sandboxes' rows and trajectories stay until their retention ends: reported, not judged.
      stateDbMiB: existsSync(join(dataDir, 'state.db')) ? Math.round(statSync(join(dataDir, 'state.db')).size / 2 ** 20) : null,
      snapshots: Math.floor((cycles - 1) / 10) + 1,
      imagesLeft,
      layersInUse: { start: layersInUseStart, end: gcEnd.keptInUse },
      layerGcAtEnd: { removed: gcEnd.removedLayers.length, keptYoung: gcEnd.keptYoung },
      checkpoints,
    };
    console.log(`soak result: ${JSON.stringify(result)}`);
    if (process.env['DSEC_SOAK_RESULTS']) writeFileSync(process.env['DSEC_SOAK_RESULTS'], `${JSON.stringify(result, null, 2)}\n`);
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} cycles failed`);
    assert.deepEqual(result.leaked, {});
    assert.deepEqual(
      checkpoints.filter((c) => Object.keys(c.leaked).length > 0),
      [],
      'nothing leaked at any checkpoint',
    );
    assert.equal(result.sandboxesLeft, 0);
    assert.deepEqual(imagesLeft, [], 'every unnamed snapshot image is deleted once its sandboxes are gone');
    assert.ok(gcEnd.keptInUse <= layersInUseStart, `layers in use grew from ${layersInUseStart} to ${gcEnd.keptInUse}`);
    // Keep-alive sockets come and go; a per-cycle leak would add one fd per cycle or more.
    assert.ok(end.fds - start.fds < 32, `fds grew from ${start.fds} to ${end.fds}`);
    assert.ok(end.childFds - start.childFds < 32, `the resident helpers' fds grew from ${start.childFds} to ${end.childFds}`);
    if (long) assert.ok(result.rssGrowthPercent < 10, `RSS grew ${result.rssGrowthPercent} %`);
  });
});

/** Cycles per second in each tenth of `ends` (ascending end times; `t0` is when the first began). */
function byTenth(ends: number[], t0: number): number[] {
  const out: number[] = [];
  let from = t0;
  for (let k = 1; k <= 10; k++) {
    const a = Math.floor(((k - 1) * ends.length) / 10);
    const b = Math.floor((k * ends.length) / 10);
    if (b <= a) continue;
    const to = ends[b - 1]!;
    out.push(Math.round(((b - a) / Math.max(0.001, (to - from) / 1000)) * 100) / 100);
    from = to;
  }
  return out;
}
