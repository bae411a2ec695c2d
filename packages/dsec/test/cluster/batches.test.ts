/**
 * Batches on a real edge: N sandboxes as one job with live progress, resumable event streams,
 * bad specs refused up front, cancellation, admission failures accounted for item by item, and a
 * control-plane restart in the middle of a batch that still ends with every item accounted for.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { batchEvents, Connection, Sandbox, type BatchEvent, type BatchInfo } from '@dsec/sdk';
import {
  integrationSkipReason,
  startDsec,
  assertCleanAndRemove,
  makeDataDir,
  newEdgeId,
  startTestServer,
  type TestServer,
} from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';

describe('batches', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer({ maxSandboxes: 40 });
  });
  after(async () => {
    await server?.close();
  });

  test('createMany: every sandbox runs, progress goes placed → running, each carries the batch label', async () => {
    const seen: BatchEvent[] = [];
    const { batchId, sandboxes, failures } = await Sandbox.createMany(12, {
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 32, pids: 32 },
      labels: { probe: 'many' },
      concurrency: 4,
      onProgress: (e) => seen.push(e),
    });
    assert.deepEqual(failures, []);
    assert.equal(sandboxes.length, 12);
    assert.equal(seen[0]?.type, 'accepted');
    assert.equal(seen.at(-1)?.type, 'done');
    assert.deepEqual(
      seen.map((e) => e.seq),
      seen.map((_e, i) => i),
      'sequence numbers count up by one',
    );
    const running = seen.filter((e) => e.type === 'running');
    assert.deepEqual(
      running.map((e) => e.index).sort((a, b) => a! - b!),
      [...Array(12).keys()],
    );
    for (const e of running) {
      const placed = seen.findIndex((p) => p.type === 'placed' && p.index === e.index);
      assert.ok(placed >= 0 && placed < e.seq, `item ${e.index} was placed before it ran`);
    }
    const r = await sandboxes[3]!.commands.run('echo from-a-batch');
    assert.equal(r.stdout, 'from-a-batch\n');
    assert.ok(sandboxes.every((s) => s.info.labels['dsec.batch'] === batchId && s.info.labels['probe'] === 'many'));
    const info = (await call(server, 'GET', `/v1/batches/${batchId}`)).json as BatchInfo;
    assert.deepEqual([info.state, info.running, info.failed, info.placed], ['done', 12, 0, 12]);
    await Promise.all(sandboxes.map((s) => s.kill()));
  });

  test('a progress stream resumes after the last event seen, with nothing lost or repeated', async () => {
    const conn = new Connection(server.conn);
    const start = (
      await call(server, 'POST', '/v1/batches', { json: { count: 5, spec: { image: 'busybox', resources: { memoryMiB: 32 } } } })
    ).json as BatchInfo;
    const first: BatchEvent[] = [];
    for await (const e of batchEvents(conn, start.id)) {
      first.push(e);
      if (first.length === 4) break; // the client drops the stream here
    }
    const rest: BatchEvent[] = [];
    for await (const e of batchEvents(conn, start.id, { after: first.at(-1)!.seq })) rest.push(e);
    const all = [...first, ...rest];
    assert.deepEqual(
      all.map((e) => e.seq),
      all.map((_e, i) => i),
    );
    assert.equal(all.at(-1)?.type, 'done');
    assert.equal(all.filter((e) => e.type === 'running').length, 5);
    const stored = await call(server, 'GET', `/v1/batches/${start.id}/events?after=2&follow=false`);
    const lines = stored.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as BatchEvent);
    assert.equal(lines[0]?.seq, 3);
    await call(server, 'DELETE', `/v1/batches/${start.id}`); // done: cancelling is a no-op
    for (const e of all.filter((x) => x.type === 'running')) await Sandbox.kill(e.sandboxId!, server.conn);
  });

  test('bad input is refused before any work: unknown image, count 0 or over 32,000, bad network', async () => {
    expectWireError(
      await call(server, 'POST', '/v1/batches', { json: { count: 3, spec: { image: 'no-such-image' } } }),
      404,
      'IMAGE_NOT_FOUND',
    );
    expectWireError(await call(server, 'POST', '/v1/batches', { json: { count: 0, spec: { image: 'busybox' } } }), 400, 'INVALID_REQUEST');
    expectWireError(
      await call(server, 'POST', '/v1/batches', { json: { count: 32_001, spec: { image: 'busybox' } } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/batches', {
        json: { count: 2, spec: { image: 'busybox', network: { mode: 'allow', allow: ['a b'] } } },
      }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(await call(server, 'GET', '/v1/batches/batch-000000000000'), 404, 'BATCH_NOT_FOUND');
    assert.deepEqual(await Sandbox.list({ ...server.conn }), []);
  });

  test('items the cluster cannot hold fail with CAPACITY_EXCEEDED, each accounted for', async () => {
    const { sandboxes, failures } = await Sandbox.createMany(45, {
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 16, pids: 16 },
      concurrency: 8,
    });
    assert.equal(sandboxes.length + failures.length, 45);
    assert.equal(sandboxes.length, 40, 'the edge admits up to its 40');
    assert.ok(
      failures.every((f) => f.code === 'CAPACITY_EXCEEDED' && /full/.test(f.reason)),
      JSON.stringify(failures.slice(0, 2)),
    );
    await Promise.all(sandboxes.map((s) => s.kill()));
  });

  test('cancel stops the batch and kills what it made', async () => {
    const b = (
      await call(server, 'POST', '/v1/batches', {
        json: { count: 30, concurrency: 2, spec: { image: 'busybox', resources: { memoryMiB: 16 } } },
      })
    ).json as BatchInfo;
    for (let i = 0; i < 200; i++) {
      const now = (await call(server, 'GET', `/v1/batches/${b.id}`)).json as BatchInfo;
      if (now.running >= 2) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    const cancelled = (await call(server, 'DELETE', `/v1/batches/${b.id}`)).json as BatchInfo;
    assert.equal(cancelled.state, 'cancelled');
    assert.ok(cancelled.running < 30);
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { 'dsec.batch': b.id } }), []);
  });

  test("a finished batch's counts match its events; counts by status; a list pages; a kill by label streams its progress", async () => {
    const { batchId } = await Sandbox.createMany(6, {
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 16 },
      labels: { probe: 'bulk' },
    });
    const info = (await call(server, 'GET', `/v1/batches/${batchId}`)).json as BatchInfo;
    const events = (await call(server, 'GET', `/v1/batches/${batchId}/events?follow=false`)).text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as BatchEvent);
    assert.equal(info.state, 'done');
    assert.deepEqual(
      { placed: info.placed, running: info.running, failed: info.failed, lastSeq: info.lastSeq },
      {
        placed: events.filter((e) => e.type === 'placed').length,
        running: events.filter((e) => e.type === 'running').length,
        failed: events.filter((e) => e.type === 'failed').length,
        lastSeq: events.at(-1)!.seq,
      },
    );
    const counts = (await call(server, 'GET', '/v1/sandboxes/counts')).json as { counts: Record<string, number>; total: number };
    assert.ok((counts.counts['running'] ?? 0) >= 6, JSON.stringify(counts));
    const p1 = (await call(server, 'GET', '/v1/sandboxes?label=probe=bulk&limit=4')).json as { sandboxes: { id: string }[]; next?: string };
    const p2 = (await call(server, 'GET', `/v1/sandboxes?label=probe=bulk&limit=4&after=${p1.next}`)).json as {
      sandboxes: { id: string }[];
      next?: string;
    };
    assert.equal(p1.sandboxes.length + p2.sandboxes.length, 6);
    assert.equal(p2.next, undefined);
    const res = await fetch(`${server.url}/v1/sandboxes/kill`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
      body: JSON.stringify({ labels: { probe: 'bulk' } }),
    });
    assert.match(res.headers.get('content-type') ?? '', /ndjson/);
    const lines = (await res.text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; total: number; done: number; ids?: string[] });
    const last = lines.at(-1)!;
    assert.equal(last.type, 'done');
    assert.equal(last.total, 6);
    assert.equal(last.ids?.length, 6);
    assert.ok(lines.slice(0, -1).every((l) => l.type === 'progress' && l.done <= l.total));
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { probe: 'bulk' } }), []);
  });
});

describe('batches across a control-plane restart', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  test('a batch interrupted by a restart is resumed and finished: every item running or failed with a reason', async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    let dsec = await startDsec(dataDir, { edgeId });
    try {
      const conn = { url: dsec.url, apiKey: dsec.apiKey };
      const b = (
        await call(conn, 'POST', '/v1/batches', {
          json: { count: 16, concurrency: 2, spec: { image: 'busybox', resources: { memoryMiB: 16 } } },
        })
      ).json as BatchInfo;
      for (let i = 0; i < 400; i++) {
        if (((await call(conn, 'GET', `/v1/batches/${b.id}`)).json as BatchInfo).running >= 3) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      await dsec.close(); // sandboxes keep running; the batch stays "running" in the store
      dsec = await startDsec(dataDir, { edgeId });
      const conn2 = { url: dsec.url, apiKey: dsec.apiKey };
      const events: BatchEvent[] = [];
      for await (const e of batchEvents(new Connection(conn2), b.id)) events.push(e);
      const info = (await call(conn2, 'GET', `/v1/batches/${b.id}`)).json as BatchInfo;
      assert.equal(info.state, 'done');
      assert.equal(info.running + info.failed, 16, JSON.stringify(info));
      const items = new Set(events.filter((e) => e.type === 'running' || e.type === 'failed').map((e) => e.index));
      assert.equal(items.size, 16, 'every item has exactly one outcome');
      const list = await Sandbox.list({ ...conn2, labels: { 'dsec.batch': b.id } });
      assert.equal(list.filter((s) => s.status === 'running').length, info.running);
      assert.ok(
        list.every((s) => s.status === 'running' || s.reason),
        'a sandbox that is not running says why',
      );
    } finally {
      await dsec.close({ killAll: true });
      await assertCleanAndRemove(dataDir, edgeId);
    }
  });
});
