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
 * CI: 32 sandboxes per scenario; DSEC_SOAK=1: 500 (DSEC_RESTART_SANDBOXES overrides).
 */
import assert from 'node:assert/strict';
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

describe(`restarts under load, cluster: ${N} sandboxes across a control-plane and an edge restart`, { skip: integrationSkipReason(), timeout }, () => {
  const h = new ClusterHarness();
  let planted: Planted[] = [];
  let before0: ReturnType<typeof census> | undefined;

  before(async () => {
    // Restarts take seconds; the edge must not be declared lost meanwhile.
    await h.start(1, { lostAfterMs: 120_000 });
    const e = h.edges[0]!;
    before0 = census(e.dataDir, e.id, []);
    planted = await plant(h.conn, N, CONCURRENCY, h.tag);
  });
  after(async () => {
    await h.close();
    for (const e of h.edges) await assertCleanAndRemove(e.dataDir, e.id);
    await assertCleanAndRemove(h.controlDir, 'none');
  });

  test('(a) the control plane killed -9 and restarted: every sandbox, session and process is as it was', async () => {
    await h.crash(h.control);
    await h.startControl();
    await h.waitFor(async () => (await h.nodes()).some((n) => n.state === 'ready'), 'the edge reports to the restarted control plane');
    assert.deepEqual(await verify(h.conn, planted, { edgeRestarted: false, concurrency: CONCURRENCY }), []);
  });

  test('(b) the edge killed -9 and restarted: every sandbox is adopted; sessions and processes are reported ended', async () => {
    const e = h.edges[0]!;
    await h.crash(e.proc);
    await h.startEdge(e);
    await h.waitFor(async () => (await h.nodes()).some((n) => n.id === e.id && n.state === 'ready'), 'the restarted edge reports');
    assert.deepEqual(await verify(h.conn, planted, { edgeRestarted: true, concurrency: CONCURRENCY }), []);
  });

  test('then: every sandbox resumes, runs and is killed, and nothing leaks', async () => {
    assert.deepEqual(await resumeCheckAndKill(h.conn, planted, CONCURRENCY), []);
    const e = h.edges[0]!;
    // The edge runs in its own network namespace: its veths and nftables tables are not in this
    // census (they go with the namespace); mounts, cgroups and processes are.
    assert.deepEqual(leaked(before0!, census(e.dataDir, e.id, planted.map((p) => p.id))), {});
  });
});

describe(`restarts under load, dsec up: ${N} sandboxes across kill -9 of control plane and edge at once`, { skip: integrationSkipReason(), timeout }, () => {
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
    planted = await plant(up.conn, N, CONCURRENCY, edgeId);
  });
  after(async () => {
    if (up && !up.running) await up.start().catch(() => undefined);
    if (up?.running) await up.stop();
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('(c) dsec up killed -9 and restarted: every sandbox is adopted; sessions and processes are reported ended', async () => {
    await up!.crash();
    await up!.start();
    assert.deepEqual(await verify(up!.conn, planted, { edgeRestarted: true, concurrency: CONCURRENCY }), []);
  });

  test('then: every sandbox resumes, runs and is killed, and nothing leaks', async () => {
    assert.deepEqual(await resumeCheckAndKill(up!.conn, planted, CONCURRENCY), []);
    // The host guard's nftables table stays while the edge runs; it goes when dsec stops.
    await up!.stop();
    assert.deepEqual(leaked(before0!, census(dataDir, edgeId, planted.map((p) => p.id))), {});
  });
});
