/**
 * The benchmark's SIMULATED edge against a real `dsec control` (startControlPlane, SQLite, the
 * busybox image): it joins and heartbeats like `dsec edge` (edge/join-loop.ts), the control plane
 * places public-API creates on it over the edge protocol, and what the API accepted is what the
 * edges hold. No crun: the simulated edge only records sandboxes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { compileOptions } from '../../src/config/options.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startControlPlane, type RunningControl } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir } from '../helpers/server.js';

const skip = integrationSkipReason();

describe('simulated edge under a real control plane', { skip }, () => {
  let control: RunningControl;
  let dataDir: string;
  const edges: RunningSimulatedEdge[] = [];
  const api = async (method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> => {
    const res = await fetch(`${control.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${control.apiKey}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return { status: res.status, body: res.status === 204 ? undefined : await res.json() };
  };
  /**
   * Runs a batch with every create taking 1 s on the edges; answers its id, the most creates the
   * edges were making at once, and its counts at the end.
   */
  const slowBatch = async (body: object): Promise<{ id: string; peak: number; running: number; failed: number }> => {
    for (const e of edges) e.edge.createDelayMs = 1000;
    try {
      const r = await api('POST', '/v1/batches', body);
      assert.equal(r.status, 202, JSON.stringify(r.body));
      const id = (r.body as { id: string }).id;
      let peak = 0;
      for (let state = 'running'; state === 'running';) {
        peak = Math.max(
          peak,
          edges.reduce((n, e) => n + e.edge.making, 0),
        );
        await new Promise((res) => setTimeout(res, 20));
        state = ((await api('GET', `/v1/batches/${id}`)).body as { state: string }).state;
      }
      const done = (await api('GET', `/v1/batches/${id}`)).body as { running: number; failed: number };
      return { id, peak, running: done.running, failed: done.failed };
    } finally {
      for (const e of edges) e.edge.createDelayMs = 0;
    }
  };
  const nodes = async (): Promise<{ id: string; state: string; sandboxes: number }[]> =>
    ((await api('GET', '/v1/nodes')).body as { nodes: { id: string; state: string; sandboxes: number }[] }).nodes;

  before(async () => {
    dataDir = makeDataDir();
    control = await startControlPlane(compileOptions({ dataDir, listen: '127.0.0.1:0', logLevel: 'silent' }, {}));
    await buildBusyboxImage(control.images);
    for (const id of ['simone', 'simtwo']) edges.push(await startSimulatedEdge({ join: control.url, token: control.joinToken, id }));
  });

  after(async () => {
    for (const e of edges) await e.close();
    await control?.close();
    // Nothing here mounts anything (no local edge, no sandbox) but doctor's tmpfs on an overlay root.
    await assertCleanAndRemove(dataDir, 'none');
  });

  test('both joined with the cluster token and are ready', async () => {
    const n = await nodes();
    assert.deepEqual(n.map((x) => [x.id, x.state]).sort(), [
      ['simone', 'ready'],
      ['simtwo', 'ready'],
    ]);
  });

  test('creates through the public API land on the simulated edges; each holds what the API placed there; kill removes it', async () => {
    const made: SandboxInfo[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await api('POST', '/v1/sandboxes', { image: 'busybox', resources: { memoryMiB: 64 } });
      assert.equal(r.status, 201, JSON.stringify(r.body));
      made.push(r.body as SandboxInfo);
    }
    for (const e of edges) {
      const placed = made
        .filter((s) => s.edge === e.id)
        .map((s) => s.id)
        .sort();
      assert.deepEqual((await e.edge.listSandboxes()).map((s) => s.id).sort(), placed, `edge ${e.id}`);
    }
    assert.ok(made.every((s) => s.status === 'running'));
    const first = made[0]!;
    assert.equal((await api('DELETE', `/v1/sandboxes/${first.id}`)).status, 204);
    const holder = edges.find((e) => e.id === first.edge)!;
    assert.ok(!(await holder.edge.listSandboxes()).some((s) => s.id === first.id));
    // What a simulated edge cannot do is said as such, through the public API too.
    const exec = await api('POST', `/v1/sandboxes/${made[1]!.id}/exec`, { cmd: ['true'] });
    assert.equal(exec.status, 400);
    assert.match(JSON.stringify(exec.body), /simulated edge/);
  });

  test('a control plane that forgot an edge gets it back at its next heartbeat (the join loop re-joins on 404)', async () => {
    await control.control.edges.remove('simtwo');
    assert.ok(!(await nodes()).some((n) => n.id === 'simtwo'));
    let back = false;
    for (let i = 0; i < 100 && !back; i++) {
      await new Promise((r) => setTimeout(r, 100));
      back = (await nodes()).some((n) => n.id === 'simtwo' && n.state === 'ready');
    }
    assert.ok(back, 'simtwo did not re-join');
  });

  test('a batch that names no concurrency has 64 creates in flight per edge (2 edges: 128), not 64 across the cluster', async () => {
    const spec = { image: 'busybox', resources: { memoryMiB: 16, cpu: 0.05 } };
    const { id, peak, running, failed } = await slowBatch({ count: 256, spec });
    assert.deepEqual([running, failed], [256, 0]);
    assert.ok(peak > 64 && peak <= 128, `creates in flight at most ${peak}`);
    // Kept with the batch's request, so a batch resumed after a restart keeps it.
    const row = await control.store.batches.get(id);
    assert.equal((JSON.parse(row!.spec) as { concurrency?: number }).concurrency, 128);
  });

  test("a project's create rate bounds a batch's concurrency, the one it asks for too: rate or 64, whichever is more", async () => {
    const post = async (key: string, path: string, body: unknown): Promise<Record<string, unknown>> => {
      const res = await fetch(`${control.url}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      const answer = (await res.json()) as Record<string, unknown>;
      assert.ok(res.status < 300, `POST ${path}: ${res.status} ${JSON.stringify(answer)}`);
      return answer;
    };
    await post(control.apiKey, '/v1/projects', { name: 'paced', quota: { createsPerSecond: 100 } });
    const key = (await post(control.apiKey, '/v1/keys', { project: 'paced', name: 'paced key' }))['key'] as string;
    const spec = { image: 'busybox', resources: { memoryMiB: 16, cpu: 0.05 } };
    // The concurrency the batch runs with is kept with its request (a resumed batch keeps it).
    const kept = async (body: object): Promise<unknown> => {
      const id = (await post(key, '/v1/batches', body))['id'] as string;
      for (let i = 0; i < 200 && (await control.store.batches.get(id))?.state === 'running'; i++)
        await new Promise((res) => setTimeout(res, 50));
      const stored = (JSON.parse((await control.store.batches.get(id))!.spec) as { concurrency?: number }).concurrency;
      // The batch's status says it too, so a client that asked for more can tell.
      const res = await fetch(`${control.url}/v1/batches/${id}`, { headers: { authorization: `Bearer ${key}` } });
      assert.equal(((await res.json()) as { concurrency?: number }).concurrency, stored, 'GET /v1/batches/{id} says the concurrency');
      return stored;
    };
    // 512 asked: each create waiting for its token would hold its edge's room, 100 a second get one.
    assert.equal(await kept({ count: 4, spec, concurrency: 512 }), 100);
    assert.equal(await kept({ count: 4, spec, concurrency: 8 }), 8, 'less than the rate: as asked');
    // No concurrency: 64 per ready edge (2 here), then the rate's bound.
    assert.equal(await kept({ count: 4, spec }), 100);
  });

  test("a batch's event write that fails is tried again: the store ends with every event, once, in order", async () => {
    const records = control.store.batches;
    const append = records.appendEvents.bind(records);
    let failures = 0;
    records.appendEvents = async (...args) => {
      if (failures < 2) {
        failures++;
        throw new Error('injected: the store is away');
      }
      return append(...args);
    };
    try {
      const spec = { image: 'busybox', resources: { memoryMiB: 16, cpu: 0.05 } };
      const r = await api('POST', '/v1/batches', { count: 40, spec });
      assert.equal(r.status, 202, JSON.stringify(r.body));
      const id = (r.body as { id: string }).id;
      // The store's row says done only once its events are written.
      for (let i = 0; i < 200 && (await control.store.batches.get(id))?.state !== 'done'; i++)
        await new Promise((res) => setTimeout(res, 50));
      const info = (await api('GET', `/v1/batches/${id}`)).body as { state: string; lastSeq: number; running: number };
      assert.equal(failures, 2, 'the writes failed twice');
      // Finished: served from the store now, which must have had every event written.
      const stored = await control.store.batches.events(id, -1);
      assert.deepEqual(
        stored.map((e) => e.seq),
        Array.from({ length: stored.length }, (_, i) => i),
      );
      assert.equal(stored.length, 1 + 40 + 40 + 1, 'accepted, 40 placed, 40 running, done');
      assert.deepEqual([info.state, info.running, info.lastSeq], ['done', 40, stored.length - 1]);
    } finally {
      records.appendEvents = append;
    }
  });

  test("a store that stays away is asked for a batch's events less and less often, and gets them all once it is back", async () => {
    const records = control.store.batches;
    const append = records.appendEvents.bind(records);
    let away = true;
    let tries = 0;
    records.appendEvents = async (...args) => {
      if (away) {
        tries++;
        throw new Error('injected: the store is away');
      }
      return append(...args);
    };
    // Creates that take 1.5 s: the batch is still running, and its events still coming, while the store is away.
    for (const e of edges) e.edge.createDelayMs = 1500;
    try {
      const spec = { image: 'busybox', resources: { memoryMiB: 16, cpu: 0.05 } };
      const r = await api('POST', '/v1/batches', { count: 10, spec });
      assert.equal(r.status, 202, JSON.stringify(r.body));
      const id = (r.body as { id: string }).id;
      await new Promise((res) => setTimeout(res, 2500));
      // The timed flush waits twice as long after each failure (50 ms, 100, 200, 400, 800: ~5
      // tries while the creates run), then the batch's finish retries with its own backoff
      // (#untilWritten: ~4 more). A fixed 50 ms wait made ~30 timed tries while the creates ran.
      assert.ok(tries >= 2 && tries <= 16, `the store was asked ${tries} times in 2.5 s`);
      away = false;
      for (let i = 0; i < 200 && (await control.store.batches.get(id))?.state !== 'done'; i++)
        await new Promise((res) => setTimeout(res, 50));
      const stored = await control.store.batches.events(id, -1);
      assert.deepEqual(
        stored.map((e) => e.seq),
        Array.from({ length: 1 + 10 + 10 + 1 }, (_, i) => i),
        'accepted, 10 placed, 10 running, done: each once, in order',
      );
    } finally {
      records.appendEvents = append;
      for (const e of edges) e.edge.createDelayMs = 0;
    }
  });

  test('a concurrency above one group (256) is split evenly into groups: 320 in flight at most, not two groups of 256', async () => {
    const spec = { image: 'busybox', resources: { memoryMiB: 16, cpu: 0.05 } };
    const { peak, running, failed } = await slowBatch({ count: 640, spec, concurrency: 320 });
    assert.deepEqual([running, failed], [640, 0]);
    assert.ok(peak > 256 && peak <= 320, `creates in flight at most ${peak}`);
  });
});
