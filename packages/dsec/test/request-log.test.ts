/**
 * Structured logs: a real dsec up logging JSON lines (pino) at debug into the test. Every line a
 * request caused carries its request id, the one returned as X-Request-Id, whichever component
 * wrote it (the server, the in-process edge's layer cache); a request on a sandbox carries the
 * sandbox's id and its edge's.
 */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { compileOptions } from '../src/config/options.js';
import { createLogger } from '../src/http/request-log.js';
import { buildBusyboxImage } from '../src/image/builders/busybox.js';
import { startAllInOne, type RunningDsec } from '../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId } from './helpers/server.js';

type Line = Record<string, unknown> & { msg?: string; reqId?: string };

describe('request logs', { skip: integrationSkipReason(), timeout: 60_000 }, () => {
  const lines: Line[] = [];
  const raw: string[] = [];
  const dataDir = makeDataDir();
  const edgeId = newEdgeId();
  let dsec: RunningDsec | undefined;

  const send = async (method: string, path: string, body?: unknown, reqId?: string): Promise<Response> =>
    fetch(`${dsec!.url}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${dsec!.apiKey}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...(reqId ? { 'x-request-id': reqId } : {}),
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });

  before(async () => {
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString().split('\n'))
          if (l.trim()) {
            raw.push(l);
            lines.push(JSON.parse(l) as Line);
          }
        done();
      },
    });
    const opts = compileOptions({ dataDir, listen: '127.0.0.1:0', edgeId, logLevel: 'debug' }, {});
    dsec = await startAllInOne(opts, { log: createLogger({ level: 'debug', destination: sink }) });
    await buildBusyboxImage(dsec.images);
  });
  after(async () => {
    await dsec?.close({ killAll: true });
    await assertCleanAndRemove(dataDir, edgeId);
  });

  test("a create's lines, its own and the edge's, carry the request id it answered with", async () => {
    const res = await send('POST', '/v1/sandboxes', { image: 'busybox' }, 'test-create-1');
    assert.equal(res.status, 201);
    assert.equal(res.headers.get('x-request-id'), 'test-create-1');
    const id = ((await res.json()) as { id: string }).id;
    const mine = lines.filter((l) => l.reqId === 'test-create-1');
    assert.ok(
      mine.some((l) => l.msg === 'request done' && l['route'] === '/v1/sandboxes' && l['status'] === 201),
      JSON.stringify(mine),
    );
    // Written by the in-process edge's layer cache (the node's first use of the layer), not by the server.
    const cached = mine.find((l) => l.msg === 'layer cached');
    assert.ok(cached, `no 'layer cached' line with the request's id: ${JSON.stringify(mine)}`);
    assert.equal(cached['edge'], edgeId);
    // Lines of no request carry no request id.
    assert.ok(lines.some((l) => l.reqId === undefined));

    const exec = await send('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'true' }, 'test-exec-1');
    assert.equal(exec.status, 200);
    const done = lines.filter((l) => l.reqId === 'test-exec-1' && l.msg === 'request done');
    assert.equal(done.length, 1, JSON.stringify(lines.filter((l) => l.reqId === 'test-exec-1')));
    assert.equal(done[0]!['sandbox'], id);
    assert.equal(done[0]!['edge'], edgeId);
    assert.equal(done[0]!['route'], '/v1/sandboxes/:id/exec');
    // One reqId key per line: the request's own logger and the scope never both add it (JSON.parse
    // would keep the last of two, so the line's text is what is counted).
    const twice = raw.filter((l) => (l.match(/"reqId":/g) ?? []).length > 1);
    assert.deepEqual(twice, [], 'a line with reqId twice');

    assert.equal((await send('DELETE', `/v1/sandboxes/${id}`)).status, 204);
  });

  test('a request without X-Request-Id gets a fresh one; an unsafe one is replaced', async () => {
    const a = await send('GET', '/v1/nodes');
    const b = await send('GET', '/v1/nodes');
    assert.match(a.headers.get('x-request-id') ?? '', /^req-[0-9a-f]{16}$/);
    assert.notEqual(a.headers.get('x-request-id'), b.headers.get('x-request-id'));
    const bad = await send('GET', '/v1/nodes', undefined, 'a b"c');
    assert.match(bad.headers.get('x-request-id') ?? '', /^req-[0-9a-f]{16}$/);
    // Errors say their id too, and their line carries the code.
    const missing = await send('GET', '/v1/sandboxes/sb-nope-0000', undefined, 'test-404');
    assert.equal(missing.status, 404);
    assert.equal(missing.headers.get('x-request-id'), 'test-404');
    const line = lines.find((l) => l.reqId === 'test-404' && l.msg === 'request done');
    assert.equal(line?.['code'], 'SANDBOX_NOT_FOUND');
    assert.equal(line?.['sandbox'], 'sb-nope-0000');
  });
});
