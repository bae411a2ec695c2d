/**
 * Two control-plane replicas on one real PostgreSQL, with two edges (the benchmark's simulated
 * edges: the edge protocol over HTTP, joined with both replicas' URLs, no crun) — any replica
 * answers any call, TTL expiry is applied once, and when one replica is SIGKILLed in the middle
 * of a batch the other takes the batch over and finishes it with every item accounted for.
 * Replica A runs in a child process (so it can die for real); replica B runs in this process
 * (test/cluster/support/replica-pair.ts).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { BatchEvent, SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { postgresSkipReason } from '../helpers/postgres.js';
import { integrationSkipReason } from '../helpers/server.js';
import { api, startReplicaPair, until, type Endpoint, type ReplicaPair } from './support/replica-pair.js';

const skip = integrationSkipReason() ?? postgresSkipReason();

describe('control-plane replicas on one PostgreSQL', { skip, timeout: 180_000 }, () => {
  let pair: ReplicaPair;
  let a: Endpoint & { joinToken: string };
  let b: ReplicaPair['b'];
  const edges: RunningSimulatedEdge[] = [];

  before(async () => {
    pair = await startReplicaPair({ name: 'dsec_replicas' });
    ({ a, b } = pair);
    for (const id of ['repone', 'reptwo']) edges.push(await startSimulatedEdge({ join: pair.join, token: a.joinToken, id }));
  });

  after(async () => {
    for (const e of edges) await e.close();
    await pair?.close();
  });

  test('the replicas share the cluster token and API keys; each sees both edges ready', async () => {
    assert.equal(b.joinToken, a.joinToken);
    assert.equal((await api(b, 'GET', '/v1/nodes')).status, 200);
    assert.equal((await api({ url: b.url, apiKey: a.apiKey }, 'GET', '/v1/nodes')).status, 200, "A's key works on B");
    for (const at of [a, b]) {
      const nodes = await until(async () => {
        const n = ((await api(at, 'GET', '/v1/nodes')).body as { nodes: { id: string; state: string }[] }).nodes;
        return n.length === 2 && n.every((x) => x.state === 'ready') ? n : undefined;
      });
      assert.deepEqual(nodes.map((n) => n.id).sort(), ['repone', 'reptwo']);
    }
  });

  test('any replica answers any call: created on A, read and listed on B, killed on B, gone on A', async () => {
    const made = (await api(a, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { case: 'any' } })).body as SandboxInfo;
    assert.equal(made.status, 'running');
    assert.equal(((await api(b, 'GET', `/v1/sandboxes/${made.id}`)).body as SandboxInfo).id, made.id);
    const listed = (await api(b, 'GET', '/v1/sandboxes?label=case=any')).body as { sandboxes: SandboxInfo[] };
    assert.deepEqual(
      listed.sandboxes.map((s) => s.id),
      [made.id],
    );
    const edge = edges.find((e) => e.id === made.edge)!;
    assert.ok(
      (await edge.edge.listSandboxes()).some((s) => s.id === made.id),
      'the edge holds it',
    );
    assert.equal((await api(b, 'DELETE', `/v1/sandboxes/${made.id}`)).status, 204);
    assert.equal((await api(a, 'GET', `/v1/sandboxes/${made.id}`)).status, 404);
    assert.ok(!(await edge.edge.listSandboxes()).some((s) => s.id === made.id), 'B reached the edge A placed it on');
  });

  test('TTL expiry is applied once: each expired sandbox is stopped, and killed on its edge exactly once', async () => {
    const made: SandboxInfo[] = [];
    for (let i = 0; i < 6; i++)
      made.push(
        (await api(i % 2 ? a : b, 'POST', '/v1/sandboxes', { image: 'busybox', ttlSeconds: 1, labels: { case: 'ttl' } }))
          .body as SandboxInfo,
      );
    await until(async () => {
      const l = ((await api(b, 'GET', '/v1/sandboxes?label=case=ttl')).body as { sandboxes: SandboxInfo[] }).sandboxes;
      return l.length === 6 && l.every((s) => s.status === 'stopped') ? l : undefined;
    });
    // A few more sweeps of both replicas pass: a second application would show as a second kill.
    await new Promise((r) => setTimeout(r, 2500));
    for (const s of made) {
      const kills = edges.reduce((n, e) => n + (e.edge.kills.get(s.id) ?? 0), 0);
      assert.equal(kills, 1, `${s.id} killed ${kills} times`);
    }
  });

  test('a nearly full edge, creates from both replicas at once: never placed past its slots or its CPU cap', async () => {
    // 2 CPUs × --cpu-overcommit 1: four sandboxes of 0.5 CPU fit, in 6 slots. Each replica alone
    // would stop at four from its own placements; together, before a heartbeat shows either's,
    // they would place up to eight without the edge's own word (edge/node/node-budget.ts).
    const tight = await startSimulatedEdge({
      join: pair.join,
      token: a.joinToken,
      id: 'reptight',
      pool: 'tight',
      node: { cpus: 2, memoryBytes: 64 * 1024 ** 3, maxSandboxes: 6, cpuOvercommit: 1 },
    });
    try {
      for (const at of [a, b])
        await until(async () => {
          const n = ((await api(at, 'GET', '/v1/nodes')).body as { nodes: { id: string; state: string }[] }).nodes;
          return n.some((x) => x.id === 'reptight' && x.state === 'ready') ? true : undefined;
        });
      const spec = { image: 'busybox', resources: { cpu: 0.5 }, placement: { pool: 'tight' }, labels: { case: 'tight' } };
      const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => api(i % 2 ? a : b, 'POST', '/v1/sandboxes', spec)));
      const made = answers.filter((r) => r.status < 300).map((r) => r.body as SandboxInfo);
      const refused = answers.filter((r) => r.status >= 300);
      for (const r of refused) {
        assert.equal(r.status, 503, JSON.stringify(r.body));
        assert.equal((r.body as { error: { code: string } }).error.code, 'CAPACITY_EXCEEDED', JSON.stringify(r.body));
      }
      assert.equal(made.length, 4, `4 of 0.5 CPU fit 2 CPUs; ${made.length} were placed`);
      assert.ok(
        made.every((s) => s.status === 'running' && s.edge === 'reptight'),
        'each one placed runs there',
      );
      const held = await tight.edge.listSandboxes();
      assert.deepEqual(held.map((s) => s.id).sort(), made.map((s) => s.id).sort(), 'the edge holds exactly the ones placed');
      assert.ok((await tight.edge.info()).capacity.cpuCommitted <= 2, 'its CPU cap held');
      // Nothing half-made: the refused creates left no row.
      const listed = ((await api(b, 'GET', '/v1/sandboxes?label=case=tight')).body as { sandboxes: SandboxInfo[] }).sandboxes;
      assert.deepEqual(listed.map((s) => s.id).sort(), made.map((s) => s.id).sort());
      for (const s of made) assert.equal((await api(a, 'DELETE', `/v1/sandboxes/${s.id}`)).status, 204);
    } finally {
      await tight.close();
    }
  });

  test('replica A is SIGKILLed in the middle of a batch: B takes the batch over and finishes it, every item accounted for', async () => {
    const count = 240;
    for (const e of edges) e.edge.createDelayMs = 40; // slow enough to die in the middle
    const created = (
      await api(a, 'POST', '/v1/batches', { count, concurrency: 8, spec: { image: 'busybox', labels: { case: 'takeover' } } })
    ).body as { id: string };
    // A has placed some and not all when it dies.
    await until(async () => {
      const info = (await api(b, 'GET', `/v1/batches/${created.id}`)).body as { running: number };
      return info.running >= 16 ? info : undefined;
    });
    await pair.killA();
    const atKill = (await api(b, 'GET', `/v1/batches/${created.id}`)).body as { state: string; running: number; failed: number };
    assert.equal(atKill.state, 'running', 'A died with the batch unfinished');
    assert.ok(atKill.running + atKill.failed < count, `A had settled ${atKill.running + atKill.failed} of ${count} when it died`);
    const done = await until(async () => {
      const info = (await api(b, 'GET', `/v1/batches/${created.id}`)).body as { state: string; running: number; failed: number };
      return info.state === 'done' ? info : undefined;
    });
    for (const e of edges) e.edge.createDelayMs = 0;
    const res = await fetch(`${b.url}/v1/batches/${created.id}/events?follow=false`, { headers: { authorization: `Bearer ${b.apiKey}` } });
    const events = (await res.text())
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as BatchEvent);
    // Each item ended once: running or failed with a reason.
    const ends = new Map<number, BatchEvent[]>();
    for (const e of events)
      if ((e.type === 'running' || e.type === 'failed') && e.index !== undefined) ends.set(e.index, [...(ends.get(e.index) ?? []), e]);
    assert.equal(ends.size, count, 'every item has an outcome');
    for (const [index, es] of ends) assert.equal(es.length, 1, `item ${index} ended ${es.length} times`);
    for (const es of ends.values())
      if (es[0]!.type === 'failed') assert.ok((es[0] as { reason?: string }).reason, 'a failed item says why');
    assert.equal(done.running + done.failed, count);
    // What the store says runs is what the edges hold, and nothing is left half-made.
    const listed = ((await api(b, 'GET', '/v1/sandboxes?label=case=takeover')).body as { sandboxes: SandboxInfo[] }).sandboxes;
    assert.ok(!listed.some((s) => s.status === 'creating'), 'no sandbox left creating');
    const running = new Set(listed.filter((s) => s.status === 'running').map((s) => s.id));
    assert.equal(running.size, done.running);
    const onEdges = new Set<string>();
    for (const e of edges) for (const s of await e.edge.listSandboxes()) onEdges.add(s.id);
    assert.deepEqual([...onEdges].sort(), [...running].sort(), 'the edges hold exactly the running ones');
  });
});
