/**
 * Restarts under load: N live sandboxes (some paused, some with an open session or a background
 * process, some with a network policy) across
 *   (a) a control-plane restart (`dsec control` killed -9, the edge keeps running),
 *   (b) an edge restart (`dsec edge` killed -9 and started again, the control plane keeps running),
 *   (c) both at once: `dsec up` (control plane and edge in one process) killed -9 and restarted.
 * After each: every sandbox is listed in its state (running or paused) with its file, network
 * policy and address, and runs a command; a session or background process is alive and works
 * when the edge did not restart, and is reported as ended with a reason (never silently gone)
 * when it did. At the end every sandbox is resumed, checked and killed, and a leak census finds
 * nothing new (mounts, cgroups, netns, veths, nftables tables, processes).
 *
 * CI: 32 sandboxes per scenario; DSEC_SOAK=1: 500 (DSEC_RESTART_SANDBOXES overrides). Each step's
 * figures (seconds taken, problems found) are printed as `restart result: {...}` and, with
 * DSEC_RESTART_RESULTS=FILE, kept in that file (rewritten after each step, so a failed run keeps
 * what it got to).
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { ClusterHarness } from '../cluster/support/cluster-harness.js';
import { census, leaked } from './census.js';
import { DsecUpChild } from './dsec-up-child.js';
import { plant, resumeCheckAndKill, verify, type Planted } from './restart-load.js';

const long = process.env['DSEC_SOAK'] === '1';
const N = Number(process.env['DSEC_RESTART_SANDBOXES'] ?? (long ? 500 : 32));
const CONCURRENCY = 8;
const timeout = long ? 3 * 3600_000 : 900_000;

const results: Record<string, unknown> = { sandboxes: N, concurrency: CONCURRENCY };
const since = (t0: number): number => Math.round((performance.now() - t0) / 100) / 10;
/** Times `work` and records its seconds and problems (the list it returns) under `step`. */
async function step(name: string, work: () => Promise<string[]>, extra: Record<string, unknown> = {}): Promise<string[]> {
  const t0 = performance.now();
  const problems = await work();
  results[name] = {
    seconds: since(t0),
    problems: problems.length,
    ...extra,
    ...(problems.length ? { firstProblems: problems.slice(0, 20) } : {}),
  };
  console.log(`restart result: ${JSON.stringify({ [name]: results[name] })}`);
  if (process.env['DSEC_RESTART_RESULTS']) writeFileSync(process.env['DSEC_RESTART_RESULTS'], `${JSON.stringify(results, null, 2)}\n`);
  return problems;
}

describe(
  `restarts under load, cluster: ${N} sandboxes across a control-plane and an edge restart`,
  { skip: integrationSkipReason(), timeout },
  () => {
    const h = new ClusterHarness();
    let planted: Planted[] = [];
    let before0: ReturnType<typeof census> | undefined;

    before(async () => {
      // Restarts take seconds; the edge must not be declared lost meanwhile.
      await h.start(1, { lostAfterMs: 120_000 });
      const e = h.edges[0]!;
      before0 = census(e.dataDir, e.id, []);
      await step('cluster: plant', async () => ((planted = await plant(h.conn, N, CONCURRENCY, h.tag)), []));
    });
    after(async () => {
      await h.close();
      for (const e of h.edges) await assertCleanAndRemove(e.dataDir, e.id);
      await assertCleanAndRemove(h.controlDir, 'none');
    });

    test('(a) the control plane killed -9 and restarted: every sandbox, session and process is as it was', async () => {
      const t0 = performance.now();
      await h.crash(h.control);
      await h.startControl();
      await h.waitFor(async () => (await h.nodes()).some((n) => n.state === 'ready'), 'the edge reports to the restarted control plane');
      const ready = since(t0);
      assert.deepEqual(
        await step('(a) control plane restart: verify', () => verify(h.conn, planted, { edgeRestarted: false, concurrency: CONCURRENCY }), {
          restartToReadySeconds: ready,
        }),
        [],
      );
    });

    test('(b) the edge killed -9 and restarted: every sandbox is adopted; sessions and processes are reported ended', async () => {
      const e = h.edges[0]!;
      const t0 = performance.now();
      await h.crash(e.proc);
      await h.startEdge(e);
      await h.waitFor(async () => (await h.nodes()).some((n) => n.id === e.id && n.state === 'ready'), 'the restarted edge reports');
      const ready = since(t0);
      assert.deepEqual(
        await step('(b) edge restart: verify', () => verify(h.conn, planted, { edgeRestarted: true, concurrency: CONCURRENCY }), {
          restartToReadySeconds: ready,
        }),
        [],
      );
    });

    test('then: every sandbox resumes, runs and is killed, and nothing leaks', async () => {
      assert.deepEqual(await step('cluster: resume, check, kill', () => resumeCheckAndKill(h.conn, planted, CONCURRENCY)), []);
      const e = h.edges[0]!;
      // The edge runs in its own network namespace: its veths and nftables tables are not in this
      // census (they go with the namespace); mounts, cgroups and processes are.
      await step('cluster: leak census', async () =>
        Object.keys(
          (results['cluster: leaked'] = leaked(
            before0!,
            census(
              e.dataDir,
              e.id,
              planted.map((p) => p.id),
            ),
          )),
        ),
      );
      assert.deepEqual(results['cluster: leaked'], {});
    });
  },
);

describe(
  `restarts under load, dsec up: ${N} sandboxes across kill -9 of control plane and edge at once`,
  { skip: integrationSkipReason(), timeout },
  () => {
    const edgeId = newEdgeId();
    let dataDir = '';
    let up: DsecUpChild | undefined;
    let planted: Planted[] = [];
    let before0: ReturnType<typeof census> | undefined;

    before(async () => {
      dataDir = makeDataDir();
      // Builds the busybox image once, in process; the crash then hits a `dsec up` child.
      await (await startDsec(dataDir, { edgeId })).close();
      up = new DsecUpChild(dataDir, edgeId);
      await up.start();
      before0 = census(dataDir, edgeId, []);
      await step('dsec up: plant', async () => ((planted = await plant(up!.conn, N, CONCURRENCY, edgeId)), []));
    });
    after(async () => {
      if (up && !up.running) await up.start().catch(() => undefined);
      if (up?.running) await up.stop();
      if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
    });

    test('(c) dsec up killed -9 and restarted: every sandbox is adopted; sessions and processes are reported ended', async () => {
      const t0 = performance.now();
      await up!.crash();
      await up!.start();
      const ready = since(t0);
      assert.deepEqual(
        await step('(c) dsec up restart: verify', () => verify(up!.conn, planted, { edgeRestarted: true, concurrency: CONCURRENCY }), {
          restartToServingSeconds: ready,
        }),
        [],
      );
    });

    test('then: every sandbox resumes, runs and is killed, and nothing leaks', async () => {
      assert.deepEqual(await step('dsec up: resume, check, kill', () => resumeCheckAndKill(up!.conn, planted, CONCURRENCY)), []);
      // The host guard's nftables table stays while the edge runs; it goes when dsec stops.
      await up!.stop();
      await step('dsec up: leak census', async () =>
        Object.keys(
          (results['dsec up: leaked'] = leaked(
            before0!,
            census(
              dataDir,
              edgeId,
              planted.map((p) => p.id),
            ),
          )),
        ),
      );
      assert.deepEqual(results['dsec up: leaked'], {});
    });
  },
);
