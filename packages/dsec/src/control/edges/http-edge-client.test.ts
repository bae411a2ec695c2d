import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { ApiError } from '../../api-error.js';
import { HttpEdgeClient } from './http-edge-client.js';

/**
 * How a JSON call to an edge ends when the edge does not answer: its timeout, the edge declared
 * lost, or its caller's abort (edge-calls.ts), each told apart, against a real HTTP server on
 * loopback that holds the calls it is told to hold.
 */
describe('HttpEdgeClient: calls that get no answer', { timeout: 30_000 }, () => {
  let server: Server;
  let url: string;
  /** Requests held unanswered, by path. */
  const held: { path: string; res: ServerResponse }[] = [];

  before(async () => {
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      if ((req.url ?? '').includes('hold')) {
        held.push({ path: req.url ?? '', res });
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ sandboxes: [] }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    for (const h of held) h.res.destroy();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  /** Resolves once the server holds `n` requests. */
  async function holding(n: number): Promise<void> {
    while (held.length < n) await new Promise((resolve) => setTimeout(resolve, 5));
  }

  test('a call past its timeout is EDGE_UNAVAILABLE with cause TimeoutError', async () => {
    const client = new HttpEdgeClient('e1', url, 'token', 100);
    const err = await client.sandboxUsage('sb-hold-aaaaaa').catch((e: unknown) => e);
    assert.ok(err instanceof ApiError, String(err));
    assert.equal(err.code, 'EDGE_UNAVAILABLE');
    assert.equal(err.details['cause'], 'TimeoutError');
    assert.equal(err.details['retryable'], false);
  });

  test('calls in flight when the edge is declared lost end at once; a call made afterwards is answered', async () => {
    const client = new HttpEdgeClient('e1', url, 'token', 60_000);
    const before = held.length;
    // No timeout on a kill: only the loss ends it.
    const kill = client.killSandbox('sb-hold-bbbbbb').catch((e: unknown) => e);
    const usage = client.sandboxUsage('sb-hold-cccccc').catch((e: unknown) => e);
    await holding(before + 2);
    client.abortInflight();
    for (const err of [await kill, await usage]) {
      assert.ok(err instanceof ApiError, String(err));
      assert.equal(err.code, 'EDGE_UNAVAILABLE');
      assert.match(err.message, /was lost during the call/);
      assert.equal(err.details['retryable'], false);
    }
    assert.deepEqual(await client.listSandboxes(), []);
  });

  test("a caller's abort ends its call with the caller's reason, and only that call", async () => {
    const client = new HttpEdgeClient('e1', url, 'token', 60_000);
    const before = held.length;
    const ctrl = new AbortController();
    const exec = client.exec('sb-hold-dddddd', { cmd: ['true'] }, ctrl.signal).catch((e: unknown) => e);
    const other = client.killSandbox('sb-hold-eeeeee').then(
      () => 'answered',
      (e: unknown) => e,
    );
    await holding(before + 2);
    const reason = new Error('the caller went away');
    ctrl.abort(reason);
    assert.equal(await exec, reason);
    // The other call is still held: answer it now, and it succeeds.
    const h = held.find((x) => x.path.includes('sb-hold-eeeeee'));
    assert.ok(h, 'the kill reached the server');
    h.res.writeHead(204).end();
    assert.equal(await other, 'answered');
  });

  test('a call whose caller had already aborted is not sent', async () => {
    const client = new HttpEdgeClient('e1', url, 'token', 60_000);
    const before = held.length;
    const reason = new Error('aborted before the call');
    const err = await client.exec('sb-hold-ffffff', { cmd: ['true'] }, AbortSignal.abort(reason)).catch((e: unknown) => e);
    assert.equal(err, reason);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(held.length, before, 'the server never saw it');
  });
});
