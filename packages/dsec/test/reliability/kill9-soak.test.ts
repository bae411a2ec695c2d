/**
 * Kill -9 soak: the soak's cycles (soak-cycle.ts, two at a time) on a `dsec up` of its own that is
 * SIGKILLed every K cycles while creates and work are in flight, and started again on the same
 * data dir and edge id. After each restart, once no create is left `creating`:
 *   - every sandbox the API accepted (a create that answered with an id) is listed running or
 *     paused, or failed with a readable reason, or is gone because its kill was asked for before
 *     the crash: none lost (sandbox-ledger.ts);
 *   - nothing runs that nothing lists: the node's crun containers, cgroups, rootfs mounts,
 *     sandbox directories and user-namespace claims are exactly the listed live sandboxes' (half-made.ts);
 *   - then every listed sandbox is killed and the leak census (census.ts) matches the one taken
 *     after the warm-up: no mount, cgroup, netns, veth, nftables table, process or directory left.
 * Cycles cut by the kill count as interrupted, not failed; the sandboxes they made are accounted
 * for as above. At the end: no failed cycle, no sandbox left, no snapshot image left, no leak.
 *
 * CI: 100 cycles with a kill every 40 (2 kills: one aimed at a create, one at the work). DSEC_SOAK=1: 10,000 with a kill every 1,000.
 * DSEC_SOAK_CYCLES, DSEC_SOAK_CONCURRENCY and DSEC_SOAK_KILL_EVERY override. Result: one JSON line
 * (`kill9 soak result: {...}`, one `kill9 soak kill:` line per kill as it goes) and, with
 * DSEC_SOAK_KILL_RESULTS=FILE, that file (rewritten after each kill, so a run cut short keeps what it got to).
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { Image, Sandbox } from '@dsec/sdk';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { census, leaked, type Census } from './census.js';
import { DsecUpChild } from './dsec-up-child.js';
import { halfMade } from './half-made.js';
import { api } from './restart-load.js';
import { SandboxLedger, type Accounting } from './sandbox-ledger.js';
import { soakCycle } from './soak-cycle.js';

const long = process.env['DSEC_SOAK'] === '1';
const cycles = Number(process.env['DSEC_SOAK_CYCLES'] ?? (long ? 10_000 : 100));
const concurrency = Number(process.env['DSEC_SOAK_CONCURRENCY'] ?? 2);
const killEvery = Number(process.env['DSEC_SOAK_KILL_EVERY'] ?? (long ? 1000 : 40));
const warmup = Math.max(2, Math.min(50, Math.floor(cycles / 20)));
/**
 * When the kill lands after cycle i begins, taking turns: within 20 ms it cuts the cycle's create
 * (its first call, which takes longer than that here), 100-300 ms later the work after it. The
 * other cycle in flight is wherever it is.
 */
function killDelay(kill: number): { aimedAt: 'create' | 'work'; delayMs: number } {
  return kill % 2 === 0
    ? { aimedAt: 'create', delayMs: Math.floor(Math.random() * 20) }
    : { aimedAt: 'work', delayMs: 100 + Math.floor(Math.random() * 200) };
}
/** A create in flight at the crash is taken over when its lease ends (10 s, control/create-leases.ts); this bounds the wait. */
const SETTLE_LIMIT_MS = 120_000;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const since = (t0: number): number => Math.round((performance.now() - t0) / 100) / 10;

interface KillReport extends Omit<Accounting, 'lost' | 'unaccounted'> {
  atCycle: number;
  aimedAt: 'create' | 'work';
  delayMs: number;
  /** Cycles in flight when dsec was killed. */
  cyclesInFlight: number;
  restartSeconds: number;
  /** Until no create was `creating`. */
  settleSeconds: number;
  lost: string[];
  unaccounted: string[];
  /** Node state of no listed live sandbox, or missing for one (half-made.ts). */
  halfMade: Record<string, string[]>;
  /** The census against the start once every listed sandbox was killed. */
  leaked: Record<string, unknown>;
}

describe(
  `kill -9 soak: ${cycles} cycles, dsec up killed -9 every ${killEvery}`,
  { skip: integrationSkipReason(), timeout: long ? 24 * 3600_000 : 900_000 },
  () => {
    const edgeId = newEdgeId();
    let dataDir = '';
    let up: DsecUpChild | undefined;
    const conn = () => ({ url: up!.conn.url, apiKey: up!.conn.apiKey });
    const ledger = new SandboxLedger();
    const made: string[] = [];
    const failures: string[] = [];
    const interrupted: number[] = [];
    const kills: KillReport[] = [];
    let completed = 0;

    before(async () => {
      dataDir = makeDataDir();
      await (await startDsec(dataDir, { edgeId })).close(); // builds the busybox image, in this process
      up = new DsecUpChild(dataDir, edgeId, { env: { MALLOC_ARENA_MAX: process.env['MALLOC_ARENA_MAX'] ?? '2' } });
      await up.start();
    });
    after(async () => {
      if (up && !up.running) await up.start();
      if (up?.running) {
        await killAll();
        await up.stop();
      }
      if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
    });

    /** Kills every listed sandbox (answered kills are settled in the ledger). */
    async function killAll(): Promise<SandboxInfo[]> {
      const list = await Sandbox.list(conn());
      for (const s of list) {
        const r = await api(conn(), 'DELETE', `/v1/sandboxes/${s.id}`);
        if (r.status < 300 || r.status === 404) ledger.gone(s.id);
        else failures.push(`kill of ${s.id} (${s.status}) after a restart answered ${r.status}: ${JSON.stringify(r.body)}`);
      }
      return list;
    }

    /** The restarted dsec's list once no create is `creating`. */
    async function settledList(): Promise<SandboxInfo[]> {
      const t0 = performance.now();
      for (;;) {
        const list = await Sandbox.list(conn());
        if (!list.some((s) => s.status === 'creating') || performance.now() - t0 > SETTLE_LIMIT_MS) return list;
        await sleep(100);
      }
    }

    /** Set while dsec is down or being accounted for: no new cycle starts until it is settled. */
    let restarting: Promise<void> | undefined;
    /** Bumped at each kill: a cycle that began in an earlier epoch and failed was cut by the kill. */
    let epoch = 0;
    const inFlight = new Set<Promise<void>>();
    const pendingKills: Promise<void>[] = [];
    let start: Census | undefined;

    /** Kill `n`: kill -9 of dsec soon after cycle `i` begins (killDelay), restart, then account and clean up (above). */
    async function crashDuring(i: number, n: number): Promise<void> {
      const { aimedAt, delayMs } = killDelay(n);
      await sleep(delayMs);
      let open!: () => void;
      restarting = new Promise((r) => (open = r));
      epoch++;
      const cyclesInFlight = inFlight.size;
      const t0 = performance.now();
      await up!.crash();
      // The cut cycles' calls fail at once (connection reset or refused); their bookkeeping must be done before the accounting.
      await Promise.allSettled([...inFlight]);
      await up!.start();
      const restartSeconds = since(t0);
      const t1 = performance.now();
      const list = await settledList();
      const settleSeconds = since(t1);
      const accounting = ledger.account(list);
      const live = new Set(list.filter((s) => s.status === 'running' || s.status === 'paused').map((s) => s.id));
      const node = halfMade(dataDir, edgeId, live);
      made.push(...list.map((s) => s.id));
      await killAll();
      const report: KillReport = {
        atCycle: i,
        aimedAt,
        delayMs,
        cyclesInFlight,
        restartSeconds,
        settleSeconds,
        ...accounting,
        halfMade: node,
        leaked: leaked(start!, census(dataDir, edgeId, made, up!.pid)),
      };
      kills.push(report);
      console.log(`kill9 soak kill: ${JSON.stringify(report)}`);
      writeResult({ partial: true, ...summary() });
      restarting = undefined;
      open();
    }

    async function run(from: number, to: number): Promise<void> {
      let next = from;
      const worker = async (): Promise<void> => {
        for (;;) {
          while (restarting) await restarting;
          if (next >= to) return;
          const i = next++;
          if (start && i % killEvery === 0) pendingKills.push(crashDuring(i, pendingKills.length));
          const began = epoch;
          const c = soakCycle(conn(), i, {
            ...ledger.track,
            created: (id) => {
              ledger.track.created!(id);
              made.push(id);
            },
          });
          inFlight.add(c);
          try {
            await c;
            completed++;
          } catch (err) {
            if (epoch !== began) interrupted.push(i);
            else failures.push(`cycle ${i}: ${(err as Error).message}`);
          } finally {
            inFlight.delete(c);
          }
        }
      };
      await Promise.all(Array.from({ length: concurrency }, worker));
      await Promise.all(pendingKills);
    }

    /** The run so far: its cycles, and what each kill found. */
    function summary() {
      const sum = (k: 'running' | 'paused' | 'failedWithReason' | 'killedAtCrash' | 'unacknowledged' | 'outstanding'): number =>
        kills.reduce((n, r) => n + r[k], 0);
      return {
        cycles,
        concurrency,
        killEvery,
        kills: kills.length,
        completedCycles: completed,
        interruptedCycles: interrupted.length,
        failures: failures.length,
        firstFailures: failures.slice(0, 5),
        accepted: ledger.acceptedTotal,
        atTheKills: {
          outstanding: sum('outstanding'),
          running: sum('running'),
          paused: sum('paused'),
          failedWithReason: sum('failedWithReason'),
          killedAtCrash: sum('killedAtCrash'),
          unacknowledged: sum('unacknowledged'),
          lost: kills.flatMap((r) => r.lost),
          unaccounted: kills.flatMap((r) => r.unaccounted),
          halfMade: kills.filter((r) => Object.keys(r.halfMade).length).map((r) => ({ atCycle: r.atCycle, ...r.halfMade })),
          leakedAfterCleanup: kills.filter((r) => Object.keys(r.leaked).length).map((r) => ({ atCycle: r.atCycle, ...r.leaked })),
        },
        outstandingAtEnd: ledger.outstanding,
        loadAverage: loadavg().map((l) => Math.round(l * 10) / 10),
        perKill: kills,
      };
    }

    function writeResult(result: object): void {
      const file = process.env['DSEC_SOAK_KILL_RESULTS'];
      if (file) writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    }

    test('every accepted sandbox is running or failed with a reason after each kill -9, and nothing leaks', async () => {
      await run(0, warmup);
      start = census(dataDir, edgeId, made, up!.pid);
      const imagesStart = (await Image.list(conn())).map((im) => im.id);
      const t0 = performance.now();
      await run(warmup, cycles);
      const seconds = since(t0);
      const left = await Sandbox.list(conn());
      const end = census(dataDir, edgeId, made, up!.pid);
      const imagesLeft = (await Image.list(conn())).map((im) => im.id).filter((id) => !imagesStart.includes(id));
      const result = {
        seconds,
        ...summary(),
        sandboxesLeft: left.length,
        imagesLeft,
        leaked: leaked(start, end),
      };
      console.log(`kill9 soak result: ${JSON.stringify(result)}`);
      writeResult(result);
      // One kill per multiple of K among the cycles after the warm-up.
      assert.equal(kills.length, Math.floor((cycles - 1) / killEvery) - Math.floor((warmup - 1) / killEvery));
      assert.deepEqual(failures.slice(0, 5), [], `${failures.length} cycles failed`);
      assert.deepEqual(result.atTheKills.lost, [], 'accepted sandboxes neither listed nor killed');
      assert.deepEqual(result.atTheKills.unaccounted, [], 'sandboxes listed neither running nor failed with a reason');
      assert.deepEqual(result.atTheKills.halfMade, [], 'containers, cgroups, mounts or directories of no listed sandbox after a restart');
      assert.deepEqual(result.atTheKills.leakedAfterCleanup, [], 'left behind once every listed sandbox was killed');
      assert.deepEqual(result.outstandingAtEnd, []);
      assert.equal(result.sandboxesLeft, 0);
      assert.deepEqual(imagesLeft, [], 'every unnamed snapshot image is deleted once its sandboxes are gone');
      assert.deepEqual(result.leaked, {});
    });
  },
);
