/**
 * /metrics (prom-client) scraped for real after real creates, execs, kills and failures, parsed
 * as the Prometheus text format: each counter and histogram moves by what was done, the route
 * label is the route pattern, and the cluster's gauges (sandboxes by state, edge capacity, layer
 * cache) say what the edge holds.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';
import { parsePromText, type Scrape } from './helpers/prom-text.js';
import { call, expectWireError } from './helpers/wire.js';
import type { NodeInfo } from '@dsec/sdk/schema';
import { renderTopFrame, type TopSample } from '../src/cli/top/top-frame.js';
import { SYSTEM } from '../src/control/service/callers.js';

describe('/metrics', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  const scrape = async (): Promise<Scrape> => {
    const res = await call(server, 'GET', '/metrics', { key: null });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
    return parsePromText(res.text);
  };

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('needs no API key and declares each family with its type', async () => {
    const m = await scrape();
    assert.equal(m.types.get('dsec_sandbox_creates_total'), 'counter');
    assert.equal(m.types.get('dsec_sandbox_create_duration_seconds'), 'histogram');
    assert.equal(m.types.get('dsec_exec_duration_seconds'), 'histogram');
    assert.equal(m.types.get('dsec_http_request_duration_seconds'), 'histogram');
    assert.equal(m.types.get('dsec_sandboxes'), 'gauge');
    assert.equal(m.types.get('dsec_layer_cache_hits_total'), 'counter');
    assert.ok((m.get('process_resident_memory_bytes') ?? 0) > 0, 'process metrics are there');
  });

  test('creates, execs, kills and errors move their counters; gauges show the running sandbox', async () => {
    const edge = { edge: server.edgeId, pool: 'default' };
    const before = await scrape();
    const sb = await Sandbox.create(server.conn);
    const second = await Sandbox.create(server.conn);
    let during: Scrape;
    try {
      await sb.commands.run('true');
      for await (const _ev of sb.commands.stream('echo hi'));
      during = await scrape();
      // A fork creates through the same path: it counts as a create too.
      const { sandboxes } = await sb.fork(1);
      assert.equal(sandboxes.length, 1);
      await sandboxes[0]!.kill();
    } finally {
      await sb.kill();
      await second.kill();
    }
    expectWireError(await call(server, 'POST', '/v1/sandboxes', { json: { image: 'no-such-image' } }), 404, 'IMAGE_NOT_FOUND');
    const after = await scrape();

    const grew = (name: string, labels: Record<string, string>, by: number): void => {
      assert.equal(after.sum(name, labels) - before.sum(name, labels), by, `${name}${JSON.stringify(labels)}`);
    };
    grew('dsec_sandbox_creates_total', { backend: 'container' }, 3);
    grew('dsec_sandbox_create_duration_seconds_count', { backend: 'container' }, 3);
    assert.ok(
      after.sum('dsec_sandbox_create_duration_seconds_sum', { backend: 'container' }) >
        before.sum('dsec_sandbox_create_duration_seconds_sum', { backend: 'container' }),
    );
    grew('dsec_sandbox_create_errors_total', { backend: 'container', code: 'IMAGE_NOT_FOUND' }, 1);
    grew('dsec_exec_duration_seconds_count', { kind: 'exec' }, 1);
    grew('dsec_exec_duration_seconds_count', { kind: 'stream' }, 1);
    grew('dsec_sandbox_kills_total', { backend: 'container', cause: 'kill' }, 3);
    grew('dsec_api_errors_total', { code: 'IMAGE_NOT_FOUND', route: '/v1/sandboxes' }, 1);
    grew('dsec_http_request_duration_seconds_count', { method: 'POST', route: '/v1/sandboxes/:id/exec', status: '200' }, 2);
    // Buckets are cumulative: +Inf holds every observation.
    assert.equal(
      after.get('dsec_http_request_duration_seconds_bucket', {
        method: 'POST',
        route: '/v1/sandboxes/:id/exec',
        status: '200',
        le: '+Inf',
      }),
      after.get('dsec_http_request_duration_seconds_count', { method: 'POST', route: '/v1/sandboxes/:id/exec', status: '200' }),
    );
    // One series per route pattern: no raw URL (no sandbox id) is ever a label value.
    assert.deepEqual(
      after.samples.filter((s) => Object.values(s.labels).some((v) => v.includes(sb.id))),
      [],
    );

    assert.equal(during!.get('dsec_sandboxes', { state: 'running', ...edge }), 2);
    assert.equal(after.get('dsec_sandboxes', { state: 'running', ...edge }), undefined, 'no running sandbox is left');
    assert.equal(during!.get('dsec_edge_up', { ...edge, state: 'ready' }), 1);
    assert.equal(during!.get('dsec_edge_sandboxes', edge), 2);
    assert.equal(during!.get('dsec_edge_max_sandboxes', edge), 4000);
    assert.ok((during!.get('dsec_edge_cpus', edge) ?? 0) >= 1);
    assert.equal(during!.get('dsec_edge_cpu_committed', edge), 2, 'two sandboxes of 1 CPU each');
    assert.ok((during!.get('dsec_edge_memory_available_bytes', edge) ?? 0) > 0);
    const util = during!.get('dsec_edge_utilisation_ratio', edge) ?? -1;
    assert.ok(util > 0 && util <= 1, `utilisation ${util}`);
    // The busybox layer came into the node cache (a miss) for the first create on this node.
    assert.ok((during!.get('dsec_layer_cache_misses_total', edge) ?? 0) >= 1);
    assert.ok((during!.get('dsec_layer_cache_entries', edge) ?? 0) >= 1);
    assert.ok((during!.get('dsec_layer_cache_bytes', edge) ?? 0) > 0);
  });

  test('a batch counts each of its creates, and no batch is left running after it is done', async () => {
    const before = await scrape();
    const res = await call(server, 'POST', '/v1/batches', { json: { count: 3, spec: { image: 'busybox' } } });
    assert.equal(res.status, 202);
    const id = (res.json as { id: string }).id;
    // The event stream ends with done: the batch is finished when it ends.
    const events = await call(server, 'GET', `/v1/batches/${id}/events?after=-1&follow=true`);
    assert.match(events.text, /"type":"done"/);
    const after = await scrape();
    // Nothing was mounted when the batch began, and the node cache held the layer: a hit, no fetch.
    const edge = { edge: server.edgeId, pool: 'default' };
    assert.ok(after.sum('dsec_layer_cache_hits_total', edge) > before.sum('dsec_layer_cache_hits_total', edge));
    assert.equal(after.sum('dsec_layer_cache_misses_total', edge), before.sum('dsec_layer_cache_misses_total', edge));
    assert.equal(
      after.sum('dsec_sandbox_creates_total', { backend: 'container' }) -
        before.sum('dsec_sandbox_creates_total', { backend: 'container' }),
      3,
    );
    assert.equal(after.get('dsec_batches_running'), 0);
    assert.equal(after.sum('dsec_batch_items', { batch: id }), 0, 'a finished batch has no progress series');
    assert.equal(await server.dsec.control.sandboxes.killByLabels(SYSTEM, { 'dsec.batch': id }), 3);
  });

  test('dsec top: a frame from two real samples gives the create rate between them; --once prints the frame', async () => {
    const cli = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));
    const look = async (at: number): Promise<TopSample> => ({
      at,
      metrics: await scrape(),
      nodes: ((await call(server, 'GET', '/v1/nodes')).json as { nodes: NodeInfo[] }).nodes,
    });
    const sb = await Sandbox.create(server.conn);
    const more: Sandbox[] = [];
    try {
      const first = await look(0);
      more.push(await Sandbox.create(server.conn), await Sandbox.create(server.conn));
      // Samples 1 s apart (by their clock): two creates between them are 2.0/s.
      const frame = renderTopFrame(first, await look(1000), { url: server.url, now: new Date('2026-11-30T12:00:00Z') });
      assert.match(frame, /^dsec top · http:\/\/127\.0\.0\.1:\d+ · 2026-11-30 12:00:00 UTC$/m);
      assert.match(frame, /^sandboxes \d+: 3 running, 0 creating, 0 paused/m);
      assert.match(frame, /^creates 2\.0\/s \(errors 0\.0\/s\)/m);
      assert.match(frame, /^edges 1: 1 ready$/m);

      const { stdout } = await promisify(execFile)(process.execPath, [cli, 'top', '--once', '--interval', '0.2'], {
        env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', DSEC_URL: server.url, DSEC_API_KEY: server.apiKey },
      });
      assert.match(stdout, /^sandboxes \d+: 3 running, 0 creating, 0 paused/m);
      assert.match(
        stdout,
        /^creates \d+(\.\d+)?\/s \(errors \d+(\.\d+)?\/s\) · kills \d+(\.\d+)?\/s · execs \d+(\.\d+)?\/s · batches running 0$/m,
      );
      // The creates above happened before --once's two samples: the last minute still shows them.
      const minute = /^last minute: creates (\d+(?:\.\d+)?)\/s \(errors [\d.]+\/s\) · kills [\d.]+\/s · execs [\d.]+\/s$/m.exec(stdout);
      assert.ok(minute && Number(minute[1]) > 0, stdout);
      const row = stdout.split('\n').find((l) => l.startsWith(`${server.edgeId} `));
      assert.ok(row, `a row for the edge:\n${stdout}`);
      // EDGE POOL STATE SANDBOXES CPU-BUSY CPU-COMMITTED MEMORY-USED UTIL LAYER-CACHE
      assert.match(
        row,
        new RegExp(
          `^${server.edgeId}\\s+default\\s+ready\\s+3/4000\\s+(\\d+%|–)\\s+3/\\d+\\s+[\\d.]+ \\w+/[\\d.]+ GiB\\s+\\d+%\\s+\\d+ layers?,`,
        ),
        row,
      );
    } finally {
      await Promise.all([sb, ...more].map((x) => x.kill()));
    }
  });
});
