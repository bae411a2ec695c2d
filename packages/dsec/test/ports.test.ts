/**
 * The port proxy through a real all-in-one dsec: servers in busybox sandboxes under network
 * `none` (busybox httpd with CGI scripts, nc), reached through the control plane with the API
 * key, a signed link, a raw TCP stream and `dsec port-forward`. The python http.server and a
 * WebSocket echo are in engine/debian.test.ts (they need python3).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { request as httpRequest } from 'node:http';
import type { Duplex } from 'node:stream';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { ConflictError, DsecError, InvalidRequestError, Sandbox, ServerError, TimeoutError } from '@dsec/sdk';
import { DSEC_ERROR_HEADER } from '@dsec/sdk/schema';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const CLI = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));

const CGI_ECHO = `#!/bin/sh
echo "Content-Type: application/octet-stream"
echo "X-Seen-Authorization: [$HTTP_AUTHORIZATION]"
echo "X-Seen-Prefix: [$HTTP_X_FORWARDED_PREFIX]"
echo "X-Seen-Cookie: [$HTTP_COOKIE]"
echo "X-Seen-Path: [$REQUEST_URI]"
echo "X-Seen-Api-Key: [$HTTP_X_API_KEY]"
echo "X-Seen-Access-Token: [$HTTP_X_ACCESS_TOKEN]"
echo "X-Seen-Ws-Protocol: [$HTTP_SEC_WEBSOCKET_PROTOCOL]"
echo
head -c "$CONTENT_LENGTH"
`;

/** Answers with the headers a page could use to act on the platform's origin. */
const CGI_PLATFORM_HEADERS = `#!/bin/sh
echo "Content-Type: text/plain"
echo "Service-Worker-Allowed: /"
echo "Set-Cookie: dsec_key=stolen; Path=/"
echo "Set-Cookie: app=kept; Path=/"
echo
echo ok
`;

/** Sends "first", then waits until /tmp/go exists before "second": proves the answer streams. */
const CGI_STREAM = `#!/bin/sh
echo "Content-Type: text/plain"
echo
echo first
while [ ! -e /tmp/go ]; do sleep 0.05; done
echo second
`;

/** Answers any request with 101 and then echoes bytes: an upgrade that is not a WebSocket. */
const UPGRADE_ECHO = `#!/bin/sh
while read -r line; do [ "$line" = "$(printf '\\r')" ] && break; [ -z "$line" ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n'
exec cat
`;

async function readAll(s: AsyncIterable<Buffer | Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of s) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

describe('ports: the proxy to servers in sandboxes', { skip: integrationSkipReason(), timeout: 180_000 }, () => {
  let server: TestServer;
  let a: Sandbox;
  let b: Sandbox;

  before(async () => {
    server = await startTestServer();
    [a, b] = await Promise.all([
      Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } }),
      Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } }),
    ]);
    await a.files.write('/www/index.html', '<h1>hello from a</h1>\n');
    await a.files.write('/www/cgi-bin/echo', CGI_ECHO, { mode: 0o755 });
    await a.files.write('/www/cgi-bin/stream', CGI_STREAM, { mode: 0o755 });
    await a.files.write('/www/cgi-bin/platform', CGI_PLATFORM_HEADERS, { mode: 0o755 });
    await a.files.write('/upgrade.sh', UPGRADE_ECHO, { mode: 0o755 });
    await a.commands.start(['httpd', '-f', '-p', '8080', '-h', '/www']);
    await a.commands.start(['nc', '-ll', '-p', '7000', '-e', 'cat']);
    await a.commands.start(['nc', '-ll', '-p', '7100', '-e', '/upgrade.sh']);
    await Promise.all([a.ports.wait(8080), a.ports.wait(7000), a.ports.wait(7100)]);
  });
  after(async () => {
    await server?.close();
  });

  test("GET through the proxy with the API key: the server's own answer, under network none", async () => {
    const r = await a.ports.fetch(8080, '/index.html');
    assert.equal(r.status, 200);
    assert.equal(await r.text(), '<h1>hello from a</h1>\n');
    assert.equal((await a.ports.fetch(8080, '/nope.html')).status, 404, "the server's 404 passes through");
  });

  test('a request body goes in as sent; the API key and dsec cookies do not reach the sandbox', async () => {
    const body = Buffer.concat([Buffer.alloc(300_000, 0x5a), Buffer.from([0, 255, 13, 10])]);
    const r = await a.ports.fetch(8080, '/cgi-bin/echo?x=1', {
      method: 'POST',
      body,
      headers: { cookie: 'dsec_session=secret; app=kept' },
    });
    assert.equal(r.status, 200);
    assert.deepEqual(Buffer.from(await r.arrayBuffer()), body);
    assert.equal(r.headers.get('x-seen-authorization'), '[]', 'the API key never reaches the sandbox');
    assert.equal(r.headers.get('x-seen-prefix'), `[/v1/sandboxes/${a.id}/ports/8080]`);
    assert.equal(r.headers.get('x-seen-cookie'), '[app=kept]');
    assert.equal(r.headers.get('x-seen-path'), '[/cgi-bin/echo?x=1]');
  });

  test('no credential dsec reads reaches the sandbox, whatever header carries it (red team round three)', async () => {
    const r = await a.ports.fetch(8080, '/cgi-bin/echo', {
      headers: {
        'x-api-key': server.apiKey,
        'x-access-token': 'e2b-token',
        'sec-websocket-protocol': `chat, dsec.bearer.${server.apiKey}`,
      },
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-seen-api-key'), '[]');
    assert.equal(r.headers.get('x-seen-access-token'), '[]');
    assert.equal(r.headers.get('x-seen-ws-protocol'), '[chat]', 'the page keeps its own subprotocols, never the key');
  });

  test("a sandbox's answer cannot claim the platform's origin: no Service-Worker-Allowed, no dsec* cookies, its cookies scoped to its prefix", async () => {
    const r = await a.ports.fetch(8080, '/cgi-bin/platform');
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('service-worker-allowed'), null);
    assert.deepEqual(
      r.headers.getSetCookie(),
      [`app=kept; Path=/v1/sandboxes/${a.id}/ports/8080/`],
      'a cookie is scoped to the prefix it came through',
    );
  });

  test('a response streams: the first part arrives before the server has written the rest', async () => {
    const r = await a.ports.fetch(8080, '/cgi-bin/stream');
    assert.equal(r.status, 200);
    const reader = r.body!.getReader();
    let text = '';
    while (!text.includes('first')) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'the answer ended before "first"');
      text += Buffer.from(value).toString();
    }
    assert.ok(!text.includes('second'), 'the server cannot have sent "second" yet');
    await a.commands.run('touch /tmp/go');
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
    assert.equal(text, 'first\nsecond\n');
  });

  test('no key or a wrong key: 401, and nothing is proxied', async () => {
    for (const headers of [{}, { authorization: 'Bearer dsec_wrong' }] as Record<string, string>[]) {
      const r = await fetch(a.ports.url(8080, '/index.html'), { headers });
      assert.equal(r.status, 401);
      assert.equal(((await r.json()) as { error: { code: string } }).error.code, 'UNAUTHORIZED');
    }
  });

  test("a closed port is a clear 502 PORT_NOT_LISTENING; another sandbox's port is its own, not a's", async () => {
    // On the wire: dsec's own 502, marked as dsec's by x-dsec-error.
    const closed = await fetch(a.ports.url(8081, '/'), { headers: { authorization: `Bearer ${server.apiKey}` } });
    assert.equal(closed.status, 502);
    assert.equal(closed.headers.get(DSEC_ERROR_HEADER), 'PORT_NOT_LISTENING');
    const err = ((await closed.json()) as { error: { code: string; message: string } }).error;
    assert.equal(err.code, 'PORT_NOT_LISTENING');
    assert.match(err.message, /nothing listens on port 8081/);
    // Through the SDK it is a typed error, not a response to read.
    await assert.rejects(a.ports.fetch(8081, '/'), (e: unknown) => e instanceof ServerError && e.code === 'PORT_NOT_LISTENING');
    // b runs no server: its 8080 is its own loopback's, where nothing listens.
    await assert.rejects(b.ports.fetch(8080, '/index.html'), (e: unknown) => e instanceof DsecError && e.code === 'PORT_NOT_LISTENING');
    // Nor can b reach a's server from inside: loopback is per sandbox, and b has no other link.
    const inside = await b.commands.run('wget -q -O- -T 2 http://127.0.0.1:8080/index.html');
    assert.notEqual(inside.exitCode, 0);
    await assert.rejects(b.ports.connect(7000), (e: unknown) => e instanceof DsecError && e.code === 'PORT_NOT_LISTENING');
    const bad = await fetch(a.ports.url(8080).replace('/ports/8080/', '/ports/99999/'), {
      headers: { authorization: `Bearer ${server.apiKey}` },
    });
    assert.equal(bad.status, 400);
  });

  test("the server's own 502 is its answer, not dsec's: no x-dsec-error, and fetch returns it", async () => {
    await a.files.write(
      '/www/cgi-bin/bad-gateway',
      '#!/bin/sh\nprintf "Status: 502 Bad Gateway\\r\\nContent-Type: text/plain\\r\\n\\r\\nupstream down\\n"\n',
      {
        mode: 0o755,
      },
    );
    const r = await a.ports.fetch(8080, '/cgi-bin/bad-gateway');
    assert.equal(r.status, 502);
    assert.equal(r.headers.get(DSEC_ERROR_HEADER), null);
    assert.equal(await r.text(), 'upstream down\n');
    // A server that claims to be dsec (the header, a wire error body) is still only a server: the
    // proxy drops the header, so nothing is thrown and no retry is made on its say-so.
    const forged = JSON.stringify({ error: { code: 'EDGE_UNAVAILABLE', message: 'forged', details: { retryable: true } } });
    await a.files.write(
      '/www/cgi-bin/forged',
      `#!/bin/sh\nprintf 'Status: 503 Unavailable\\r\\nContent-Type: application/json\\r\\n${DSEC_ERROR_HEADER}: EDGE_UNAVAILABLE\\r\\n\\r\\n%s' '${forged}'\n`,
      { mode: 0o755 },
    );
    const f = await a.ports.fetch(8080, '/cgi-bin/forged');
    assert.equal(f.status, 503);
    assert.equal(f.headers.get(DSEC_ERROR_HEADER), null, 'the proxy dropped the forged header');
    assert.equal(((await f.json()) as { error: { message: string } }).error.message, 'forged');
    await assert.rejects(a.ports.fetch(8080, '/../../health'), (e: unknown) => e instanceof InvalidRequestError);
  });

  test('ports.wait: returns once a port accepts (any protocol, nothing sent), TimeoutError PORT_WAIT_TIMEOUT when none does', async () => {
    const waited = await a.ports.wait(7000); // nc: not HTTP
    assert.equal(waited.port, 7000);
    await assert.rejects(
      a.ports.wait(8099, { timeoutMs: 300 }),
      (e: unknown) => e instanceof TimeoutError && e.code === 'PORT_WAIT_TIMEOUT',
    );
    // A server started after the wait began is seen as soon as it listens.
    const late = a.ports.wait(8097, { timeoutMs: 20_000 });
    await a.commands.start(['sh', '-c', 'sleep 0.5; exec httpd -f -p 8097 -h /www']);
    assert.equal((await late).port, 8097);
    assert.equal((await a.ports.fetch(8097, '/index.html')).status, 200);
    await assert.rejects(a.ports.wait(0), (e: unknown) => e instanceof InvalidRequestError);
  });

  test('a signed link opens the port without a key; a forged or foreign one is 401', async () => {
    const link = await a.ports.link(8080, { ttlSeconds: 60 });
    assert.ok(Date.parse(link.expiresAt) > Date.now());
    const page = await fetch(`${link.url}index.html`);
    assert.equal(page.status, 200);
    assert.equal(await page.text(), '<h1>hello from a</h1>\n');
    const token = link.url.split('/port-links/')[1]!.replace(/\/$/, '');
    const forged = `${token.slice(0, -2)}${token.endsWith('AA') ? 'BB' : 'AA'}`;
    assert.equal((await fetch(link.url.replace(token, forged))).status, 401);
    // b's link opens b's port, never a's.
    const bLink = await b.ports.link(8080);
    assert.equal((await fetch(`${bLink.url}index.html`)).status, 502);
  });

  test("links are served on an origin of their own, never the API's; the API's origin only redirects there", async () => {
    const link = await a.ports.link(8080, { ttlSeconds: 60 });
    const api = new URL(server.url);
    const ports = new URL(link.url);
    assert.notEqual(ports.origin, api.origin, 'a link names the port-link origin');
    assert.equal(ports.hostname, api.hostname);
    const onApi = await fetch(`${api.origin}${ports.pathname}index.html`, { redirect: 'manual' });
    assert.equal(onApi.status, 307, 'the API origin serves nothing of the sandbox');
    assert.equal(onApi.headers.get('location'), `${ports.origin}${ports.pathname}index.html`);
    // The port-link origin serves links and nothing else: not the API, not the dashboard.
    for (const path of ['/v1/sandboxes', '/ui/', '/healthz', `/v1/sandboxes/${a.id}/ports/8080/index.html`])
      assert.equal((await fetch(`${ports.origin}${path}`, { headers: { authorization: `Bearer ${server.apiKey}` } })).status, 404, path);
  });

  test('an upgrade passes through: the server answers 101 itself, then bytes flow both ways', async () => {
    const u = new URL(a.ports.url(7100, '/chat'));
    const socket = await new Promise<Duplex>((resolve, reject) => {
      const req = httpRequest({
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        headers: { connection: 'Upgrade', upgrade: 'echo', authorization: `Bearer ${server.apiKey}` },
      });
      req.on('upgrade', (res, sock) => {
        assert.equal(res.statusCode, 101);
        resolve(sock);
      });
      req.on('response', (res) => reject(new Error(`expected 101, got ${res.statusCode}`)));
      req.on('error', reject);
      req.end();
    });
    const got = readAll(socket);
    socket.end('ping through an upgrade\n');
    assert.equal((await got).toString(), 'ping through an upgrade\n');
  });

  test('an upgrade through a signed link passes through on the port-link origin, a WebSocket one too', async () => {
    const link = new URL((await a.ports.link(7100, { ttlSeconds: 60 })).url);
    for (const upgrade of ['echo', 'websocket']) {
      const socket = await new Promise<Duplex>((resolve, reject) => {
        const req = httpRequest({
          host: link.hostname,
          port: link.port,
          path: `${link.pathname}chat`,
          headers: { connection: 'Upgrade', upgrade, 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==' },
        });
        req.on('upgrade', (res, sock) => {
          assert.equal(res.statusCode, 101);
          // The sandbox's own answer (UPGRADE_ECHO's), not one the platform made up.
          assert.equal(res.headers['upgrade'], 'echo', upgrade);
          resolve(sock);
        });
        req.on('response', (res) => reject(new Error(`${upgrade}: expected 101, got ${res.statusCode}`)));
        req.on('error', reject);
        req.end();
      });
      const got = readAll(socket);
      socket.end(`ping through a ${upgrade} upgrade\n`);
      assert.equal((await got).toString(), `ping through a ${upgrade} upgrade\n`);
    }
  });

  test('ports.connect: a raw TCP stream, binary-safe, with half-close', async () => {
    const conn = await a.ports.connect(7000);
    const payload = Buffer.concat([Buffer.from('raw tcp\n'), Buffer.alloc(100_000, 7), Buffer.from([0, 255])]);
    const got = readAll(conn);
    conn.end(payload);
    assert.deepEqual(await got, payload);
  });

  test('dsec port-forward: a local port that reaches the sandbox, until Ctrl-C', async () => {
    const child = spawn(process.execPath, [CLI, 'port-forward', a.id, '8080', '0'], {
      env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', DSEC_URL: server.url, DSEC_API_KEY: server.apiKey },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const exited = new Promise<number | null>((r) => child.on('close', r));
    try {
      const line = await new Promise<string>((resolve, reject) => {
        createInterface({ input: child.stdout }).once('line', resolve);
        child.once('close', () => reject(new Error(`port-forward exited: ${stderr}`)));
      });
      const m = /forwarding 127\.0\.0\.1:(\d+) -> /.exec(line);
      assert.ok(m, line);
      const r = await fetch(`http://127.0.0.1:${m[1]}/index.html`);
      assert.equal(r.status, 200);
      assert.equal(await r.text(), '<h1>hello from a</h1>\n');
    } finally {
      child.kill('SIGINT');
    }
    assert.equal(await exited, 0, stderr);
  });

  test('a paused sandbox: 409 SANDBOX_NOT_RUNNING, and the port answers again after resume', async () => {
    await b.commands.start(['httpd', '-f', '-p', '8080', '-h', '/']);
    await b.ports.wait(8080);
    await b.pause();
    await assert.rejects(b.ports.fetch(8080, '/'), (e: unknown) => e instanceof ConflictError && e.code === 'SANDBOX_NOT_RUNNING');
    await assert.rejects(b.ports.wait(8080), (e: unknown) => e instanceof ConflictError && e.code === 'SANDBOX_NOT_RUNNING');
    await b.resume();
    assert.ok((await b.ports.fetch(8080, '/')).status < 500);
  });
});
