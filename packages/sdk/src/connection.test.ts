import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { Connection, resolveConnection } from './connection.js';
import { AbortedError, AuthError, DsecError, NotFoundError, TimeoutError, UnavailableError } from './errors.js';

/** Runs `fn` with some environment variables set (undefined: unset), then restores them. */
function withEnv<T>(vars: Record<string, string | undefined>, fn: () => T): T {
  const saved: Record<string, string | undefined> = {};
  for (const k of Object.keys(vars)) {
    saved[k] = process.env[k];
    if (vars[k] === undefined) delete process.env[k];
    else process.env[k] = vars[k];
  }
  try {
    return fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

describe('resolveConnection', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-sdk-conn-'));
    writeFileSync(join(dir, 'client.json'), JSON.stringify({ url: 'http://127.0.0.1:1111', apiKey: 'from-file' }));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  const noEnv = { DSEC_URL: undefined, DSEC_API_KEY: undefined };

  test('explicit options win over env and client.json', () => {
    const c = withEnv({ DSEC_URL: 'http://127.0.0.1:2222', DSEC_API_KEY: 'from-env', DSEC_DATA_DIR: dir }, () =>
      resolveConnection({ url: 'http://127.0.0.1:3333', apiKey: 'explicit' }),
    );
    assert.equal(c.url, 'http://127.0.0.1:3333');
    assert.equal(c.apiKey, 'explicit');
  });

  test('DSEC_URL and DSEC_API_KEY win over client.json', () => {
    const c = withEnv({ DSEC_URL: 'http://127.0.0.1:2222', DSEC_API_KEY: 'from-env', DSEC_DATA_DIR: dir }, () => resolveConnection());
    assert.equal(c.url, 'http://127.0.0.1:2222');
    assert.equal(c.apiKey, 'from-env');
  });

  test('client.json in DSEC_DATA_DIR is used when nothing else is set', () => {
    const c = withEnv({ ...noEnv, DSEC_DATA_DIR: dir }, () => resolveConnection());
    assert.equal(c.url, 'http://127.0.0.1:1111');
    assert.equal(c.apiKey, 'from-file');
  });

  test('a key from the env combines with a url from client.json', () => {
    const c = withEnv({ DSEC_URL: undefined, DSEC_API_KEY: 'from-env', DSEC_DATA_DIR: dir }, () => resolveConnection());
    assert.equal(c.url, 'http://127.0.0.1:1111');
    assert.equal(c.apiKey, 'from-env');
  });

  test("client.json's key goes only to the server it names, never to a DSEC_URL elsewhere", () => {
    withEnv({ DSEC_URL: 'http://remote.example:8080', DSEC_API_KEY: undefined, DSEC_DATA_DIR: dir }, () => {
      assert.throws(
        () => resolveConnection(),
        (err: unknown) =>
          err instanceof DsecError &&
          err.code === 'NOT_CONFIGURED' &&
          /DSEC_API_KEY/.test(err.message) &&
          err.message.includes('127.0.0.1:1111'),
      );
    });
    const same = withEnv({ DSEC_URL: 'http://127.0.0.1:1111/', DSEC_API_KEY: undefined, DSEC_DATA_DIR: dir }, () => resolveConnection());
    assert.equal(same.apiKey, 'from-file', 'the same origin, spelt with a slash, gets its key');
    withEnv({ ...noEnv, DSEC_DATA_DIR: dir }, () => assert.throws(() => resolveConnection({ url: 'http://127.0.0.1:2222' }), DsecError));
  });

  test('trailing slashes are removed from the url', () => {
    assert.equal(resolveConnection({ url: 'http://127.0.0.1:1//', apiKey: 'k' }).url, 'http://127.0.0.1:1');
  });

  test('the request timeout defaults to 120 s', () => {
    assert.equal(resolveConnection({ url: 'http://127.0.0.1:1', apiKey: 'k' }).requestTimeoutMs, 120_000);
  });

  test('nothing configured → DsecError NOT_CONFIGURED saying what to set', () => {
    withEnv({ ...noEnv, DSEC_DATA_DIR: join(dir, 'missing') }, () => {
      assert.throws(
        () => resolveConnection(),
        (err: unknown) => {
          assert.ok(err instanceof DsecError);
          assert.equal(err.code, 'NOT_CONFIGURED');
          assert.match(err.message, /DSEC_URL/);
          assert.match(err.message, /DSEC_DATA_DIR/, 'a custom data dir user must learn which variable points at it');
          assert.ok(err.message.includes(join(dir, 'missing', 'client.json')), err.message);
          return true;
        },
      );
    });
  });
});

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

describe('Connection against a local HTTP server', () => {
  let server: Server;
  let url: string;
  let seen: Seen[];
  let reply: (req: IncomingMessage, res: ServerResponse) => void;

  before(async () => {
    server = createServer((req, res) => {
      res.setHeader('connection', 'close'); // no keep-alive: each call gets a fresh socket
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        seen.push({ method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks) });
        reply(req, res);
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
  beforeEach(() => {
    seen = [];
    reply = (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
  });

  const conn = (): Connection => new Connection({ url, apiKey: 'secret-key' });

  test('sends the API key as a Bearer token', async () => {
    await conn().json('GET', '/v1/x');
    assert.equal(seen[0]!.headers['authorization'], 'Bearer secret-key');
  });

  test('sends JSON bodies with content-type application/json', async () => {
    await conn().json('POST', '/v1/x', { json: { a: [1, 2] } });
    assert.equal(seen[0]!.headers['content-type'], 'application/json');
    assert.deepEqual(JSON.parse(seen[0]!.body.toString()), { a: [1, 2] });
  });

  test('sends raw bodies as application/octet-stream, byte for byte', async () => {
    await conn().json('PUT', '/v1/x', { body: new Uint8Array([0, 255, 10]) });
    assert.equal(seen[0]!.headers['content-type'], 'application/octet-stream');
    assert.deepEqual([...seen[0]!.body], [0, 255, 10]);
  });

  test('query values are encoded; arrays repeat the key; undefined is left out', async () => {
    await conn().json('GET', '/v1/x', { query: { label: ['a=1', 'b=x y&z'], path: '/tmp/a b', none: undefined } });
    const q = new URL(seen[0]!.url, url).searchParams;
    assert.deepEqual(q.getAll('label'), ['a=1', 'b=x y&z']);
    assert.equal(q.get('path'), '/tmp/a b');
    assert.equal(q.has('none'), false);
  });

  test('json() answers undefined for 204', async () => {
    reply = (_req, res) => res.writeHead(204).end();
    assert.equal(await conn().json('DELETE', '/v1/x'), undefined);
  });

  test('a wire error becomes the mapped class with code, message and details', async () => {
    reply = (_req, res) =>
      res
        .writeHead(404, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { code: 'SANDBOX_NOT_FOUND', message: 'no sandbox x', details: { id: 'x' } } }));
    await assert.rejects(conn().json('GET', '/v1/x'), (err: unknown) => {
      assert.ok(err instanceof NotFoundError);
      assert.equal(err.code, 'SANDBOX_NOT_FOUND');
      assert.equal(err.message, 'no sandbox x');
      assert.equal(err.status, 404);
      assert.deepEqual(err.details, { id: 'x' });
      return true;
    });
  });

  test('a retryable EDGE_UNAVAILABLE (a stalled edge, nothing sent to it) is tried again until it is answered', async () => {
    let refusals = 3;
    reply = (_req, res) => {
      if (refusals-- > 0)
        res
          .writeHead(503, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: { code: 'EDGE_UNAVAILABLE', message: 'edge e1 is lost', details: { retryable: true } } }));
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    };
    assert.deepEqual(await conn().json('POST', '/v1/sandboxes/x/exec', { json: { cmd: 'true' } }), { ok: true });
    assert.equal(seen.length, 4, 'three refusals, then the answer');
    refusals = 1;
    assert.equal((await conn().request('GET', '/v1/x')).status, 200, 'streamed calls too');
  });

  test('a retryable EDGE_UNAVAILABLE past the deadline, and one that is not retryable, are thrown', async () => {
    reply = (_req, res) =>
      res
        .writeHead(503, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { code: 'EDGE_UNAVAILABLE', message: 'edge e1 is lost', details: { retryable: true } } }));
    await assert.rejects(conn().json('GET', '/v1/x', { timeoutMs: 1200 }), (err: unknown) => err instanceof UnavailableError);
    assert.ok(seen.length >= 2 && seen.length <= 5, `tried ${seen.length} times within 1.2 s`);
    seen = [];
    reply = (_req, res) =>
      res
        .writeHead(503, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { code: 'EDGE_UNAVAILABLE', message: 'the outcome is unknown', details: { retryable: false } } }));
    await assert.rejects(conn().json('POST', '/v1/x'), (err: unknown) => err instanceof UnavailableError);
    assert.equal(seen.length, 1, 'a call that may have reached the edge is not sent again');
  });

  test('an error answer that is not JSON still maps by status (HTTP_<status>)', async () => {
    reply = (_req, res) => res.writeHead(401, { 'content-type': 'text/plain' }).end('go away');
    await assert.rejects(conn().json('GET', '/v1/x'), (err: unknown) => err instanceof AuthError && err.code === 'HTTP_401');
  });

  test('a call that takes longer than timeoutMs fails with TimeoutError (TIMEOUT) naming that deadline', async () => {
    reply = () => {}; // never answers
    await assert.rejects(
      conn().json('GET', '/v1/slow', { timeoutMs: 50 }),
      (err: unknown) => err instanceof TimeoutError && err.code === 'TIMEOUT' && /did not finish within 50 ms/.test(err.message),
    );
  });

  test("the caller's AbortController fails the call with AbortedError (ABORTED) giving the reason, not a timeout", async () => {
    reply = () => {};
    const ac = new AbortController();
    const pending = conn().json('GET', '/v1/slow', { signal: ac.signal });
    ac.abort(new Error('user pressed stop'));
    await assert.rejects(pending, (err: unknown) => {
      assert.ok(err instanceof AbortedError, String(err));
      assert.equal(err.code, 'ABORTED');
      assert.match(err.message, /aborted by the caller's signal \(user pressed stop\)/);
      return true;
    });
  });

  test("the caller's AbortSignal.timeout(…) says the signal timed out, not the call's own 120000 ms deadline", async () => {
    reply = () => {};
    await assert.rejects(conn().json('GET', '/v1/slow', { signal: AbortSignal.timeout(50) }), (err: unknown) => {
      assert.ok(err instanceof TimeoutError, String(err));
      assert.equal(err.code, 'ABORTED');
      assert.match(err.message, /the caller's signal timed out/);
      assert.doesNotMatch(err.message, /120000/);
      return true;
    });
  });

  test('a server that is not there → DsecError UNREACHABLE naming the url', async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const deadUrl = `http://127.0.0.1:${(closed.address() as AddressInfo).port}`;
    await new Promise((r) => closed.close(r));
    await assert.rejects(new Connection({ url: deadUrl, apiKey: 'k' }).json('GET', '/v1/x'), (err: unknown) => {
      assert.ok(err instanceof DsecError);
      assert.equal(err.code, 'UNREACHABLE');
      assert.ok(err.message.includes(deadUrl));
      return true;
    });
  });
});

describe('Connection: JSON calls on kept-alive sockets (http-call.ts)', () => {
  let server: Server;
  let url = '';
  let connections = 0;
  let reply: (req: IncomingMessage, res: ServerResponse) => void = () => {};

  before(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => reply(req, res));
    });
    server.on('connection', () => connections++);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
  beforeEach(() => {
    connections = 0;
    server.keepAliveTimeout = 5000;
    reply = (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"n":1}');
  });

  test('back-to-back calls reuse one connection', async () => {
    const conn = new Connection({ url, apiKey: 'k' });
    for (let i = 0; i < 20; i++) assert.deepEqual(await conn.json('POST', '/v1/x', { json: { i } }), { n: 1 });
    assert.ok(connections <= 1, `${connections} connections for 20 calls`); // 0 when an earlier test's socket was still free
  });

  test('a call after the server dropped an idle connection opens a new one and succeeds', async () => {
    server.keepAliveTimeout = 50; // announced as timeout=0: the agent keeps nothing it cannot trust
    const conn = new Connection({ url, apiKey: 'k' });
    await conn.json('GET', '/v1/x');
    await new Promise((r) => setTimeout(r, 200)); // the server has closed it by now
    const opened = connections;
    assert.deepEqual(await conn.json('GET', '/v1/x'), { n: 1 });
    assert.equal(connections, opened + 1);
  });

  test('a kept-alive connection reset as a call goes out on it: the call is sent once more on a new one', async () => {
    const conn = new Connection({ url, apiKey: 'k' });
    await conn.json('GET', '/v1/x'); // leaves a free socket in the agent
    const opened = connections;
    let resets = 0;
    reply = (req, res) => {
      // What the client sees when the server closed an idle connection just as the call went out.
      if (resets === 0 && connections === opened) {
        resets++;
        req.socket.resetAndDestroy();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"n":3}');
    };
    assert.deepEqual(await conn.json('POST', '/v1/x', { json: {} }), { n: 3 });
    assert.equal(resets, 1);
    assert.equal(connections, opened + 1);
  });

  test('the deadline covers the answer body: headers then silence fails with TimeoutError', async () => {
    reply = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"n":'); // and nothing more
    };
    await assert.rejects(
      new Connection({ url, apiKey: 'k' }).json('GET', '/v1/half', { timeoutMs: 100 }),
      (err: unknown) => err instanceof TimeoutError && err.code === 'TIMEOUT',
    );
  });

  test('an answer cut off by the server fails with UNREACHABLE, not a parse error or a hang', async () => {
    reply = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"n":');
      setTimeout(() => res.socket?.destroy(), 20);
    };
    await assert.rejects(
      new Connection({ url, apiKey: 'k' }).json('GET', '/v1/cut'),
      (err: unknown) => err instanceof DsecError && err.code === 'UNREACHABLE',
    );
  });

  test('an aborted call leaves no socket in use: the next call still gets its answer', async () => {
    let hold: ServerResponse | undefined;
    reply = (req, res) => {
      if (req.url === '/v1/slow') hold = res;
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{"n":2}');
    };
    const conn = new Connection({ url, apiKey: 'k' });
    const ac = new AbortController();
    const pending = conn.json('GET', '/v1/slow', { signal: ac.signal });
    await new Promise((r) => setTimeout(r, 50));
    ac.abort(new Error('stop'));
    await assert.rejects(pending, (err: unknown) => err instanceof AbortedError);
    assert.deepEqual(await conn.json('GET', '/v1/fast'), { n: 2 });
    hold?.end();
  });
});
