/**
 * E2B's wire protocol on dsec, spoken by hand where the SDK never goes: Connect error codes and
 * statuses, keep-alives on an idle stream, a deadline ending a stream, the access-token and
 * header dispatch rules, bad REST input, and the `dsec e2b-key` CLI. Uses the busybox image only.
 * A suite of e2b-sdk.test.ts, on its server (one server for all E2B tests).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { before, describe, test } from 'node:test';
import { decodeEnvelopes, FLAG_END_STREAM, messageEnvelope } from '../../src/control/e2b/connect-protocol.js';
import type { TestServer } from '../helpers/server.js';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const ROOT = `Basic ${Buffer.from('root:').toString('base64')}`;

function cli(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const guard = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    });
  });
}

export function wireProtocolTests(getServer: () => TestServer): void {
  describe('E2B wire protocol on dsec', () => {
    let server: TestServer;
    let key: string;
    let sandboxId: string;
    let token: string;

    const rest = (method: string, path: string, body?: unknown): Promise<Response> =>
      fetch(`${server.url}${path}`, {
        method,
        headers: { 'x-api-key': key, 'content-type': 'application/json' },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });

    const unary = (method: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> =>
      fetch(`${server.url}/${method}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'connect-protocol-version': '1',
          'e2b-sandbox-id': sandboxId,
          'x-access-token': token,
          authorization: ROOT,
          ...headers,
        },
        body: JSON.stringify(body),
      });

    /** A server-streaming call, read to its end: the messages and the end-of-stream JSON. */
    const stream = async (
      method: string,
      body: unknown,
      headers: Record<string, string> = {},
    ): Promise<{ messages: Record<string, unknown>[]; end: Record<string, unknown> }> => {
      const res = await fetch(`${server.url}/${method}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/connect+json',
          'connect-protocol-version': '1',
          'e2b-sandbox-id': sandboxId,
          'x-access-token': token,
          authorization: ROOT,
          ...headers,
        },
        body: messageEnvelope(body),
      });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('content-type'), 'application/connect+json');
      const envs = decodeEnvelopes(Buffer.from(await res.arrayBuffer()));
      const last = envs.at(-1)!;
      assert.equal(last.flags, FLAG_END_STREAM, 'a stream ends with an end-of-stream envelope');
      return {
        messages: envs.slice(0, -1).map((e) => JSON.parse(e.payload.toString()) as Record<string, unknown>),
        end: JSON.parse(last.payload.toString()) as Record<string, unknown>,
      };
    };

    before(async () => {
      server = getServer();
      const r = await cli(['e2b-key', '--name', 'wire'], { DSEC_URL: server.url, DSEC_API_KEY: server.apiKey });
      assert.equal(r.code, 0, r.stderr);
      const m = /^E2B_API_URL=(.*)\nE2B_SANDBOX_URL=(.*)\nE2B_API_KEY=(e2b_[0-9a-f]{40})\n$/.exec(r.stdout);
      assert.ok(m, r.stdout);
      assert.equal(m[1], server.url);
      assert.equal(m[2], server.url);
      key = m[3]!;
      const res = await rest('POST', '/sandboxes', { templateID: 'busybox', timeout: 300 });
      assert.equal(res.status, 201);
      const sb = (await res.json()) as Record<string, string>;
      for (const f of ['templateID', 'sandboxID', 'clientID', 'envdVersion', 'envdAccessToken'])
        assert.equal(typeof sb[f], 'string', `create answer lacks ${f}`);
      sandboxId = sb['sandboxID']!;
      token = sb['envdAccessToken']!;
    });

    test('unary calls answer JSON; errors carry a Connect code with its HTTP status', async () => {
      const list = await unary('process.Process/List', {});
      assert.equal(list.status, 200);
      assert.deepEqual(await list.json(), { processes: [] });
      const missing = await unary('process.Process/SendSignal', { process: { pid: 4242 }, signal: 'SIGNAL_SIGKILL' });
      assert.equal(missing.status, 404);
      assert.equal(((await missing.json()) as { code: string }).code, 'not_found');
      const stat = await unary('filesystem.Filesystem/Stat', { path: '/no/such' });
      assert.equal(stat.status, 404);
      const unknown = await unary('process.Process/StreamInput', {});
      assert.equal(unknown.status, 501);
      assert.match(
        ((await unknown.json()) as { code: string; message: string }).message,
        /does not implement process\.Process\/StreamInput/,
      );
      const proto = await unary('process.Process/List', {}, { 'content-type': 'application/proto' });
      assert.equal(proto.status, 400);
    });

    test('the sandbox side needs the sandbox access token; a wrong token answers as a gone sandbox does (502), no token is 401', async () => {
      const none = await fetch(`${server.url}/process.Process/List`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'connect-protocol-version': '1', 'e2b-sandbox-id': sandboxId, authorization: ROOT },
        body: '{}',
      });
      assert.equal(none.status, 401);
      assert.equal(((await none.json()) as { code: string }).code, 'unauthenticated');
      // Red team round three: a wrong token and an unknown sandbox are one answer (no existence oracle).
      const wrong = await unary('process.Process/List', {}, { 'x-access-token': 'nope' });
      const gone = await unary('process.Process/List', {}, { 'e2b-sandbox-id': 'sb-nope-0000000000000' });
      for (const a of [wrong, gone]) {
        assert.equal(a.status, 502);
        const body = (await a.json()) as { code: string; message: string };
        assert.equal(body.code, 'unavailable');
        assert.match(body.message, /answers this access token/);
      }
      const health = await fetch(`${server.url}/health`, { headers: { 'e2b-sandbox-id': sandboxId, 'x-access-token': token } });
      assert.equal(health.status, 204);
      for (const headers of [
        { 'e2b-sandbox-id': sandboxId },
        { 'e2b-sandbox-id': sandboxId, 'x-access-token': 'nope' },
        { 'e2b-sandbox-id': 'sb-nope-0000000000000', 'x-access-token': token },
      ] as Record<string, string>[])
        assert.equal((await fetch(`${server.url}/health`, { headers })).status, 502, JSON.stringify(headers));
      // without the header the sandbox side cannot be reached, even by its internal path
      const direct = await fetch(`${server.url}/e2b-sandbox/health`, { headers: { 'x-access-token': token } });
      assert.equal(direct.status, 404);
    });

    test('a stream sends start, keep-alives while idle, output, the end event and end-of-stream', async () => {
      const { messages, end } = await stream(
        'process.Process/Start',
        { process: { cmd: '/bin/sh', args: ['-c', 'sleep 2.5; echo done'], envs: {} } },
        { 'keepalive-ping-interval': '1' },
      );
      assert.deepEqual(end, {});
      const events = messages.map((m) => (m['event'] as Record<string, unknown>) ?? {});
      assert.ok(events[0]!['start'], JSON.stringify(events[0]));
      assert.ok(
        events.some((e) => 'keepalive' in e),
        `no keep-alive in ${JSON.stringify(events)}`,
      );
      const out = events
        .filter((e) => e['data'])
        .map((e) => Buffer.from((e['data'] as { stdout: string }).stdout, 'base64').toString())
        .join('');
      assert.equal(out, 'done\n');
      assert.deepEqual(events.at(-1)!['end'], { exitCode: 0, exited: true, status: 'exit status 0' });
    });

    test('a stream past its Connect-Timeout-Ms ends with deadline_exceeded and its process is killed', async () => {
      const { messages, end } = await stream(
        'process.Process/Start',
        { process: { cmd: '/bin/sleep', args: ['30'] }, tag: 'sleeper' },
        { 'connect-timeout-ms': '700' },
      );
      assert.equal((end['error'] as { code: string }).code, 'deadline_exceeded');
      assert.ok((messages[0]!['event'] as Record<string, unknown>)['start']);
      const list = (await (await unary('process.Process/List', {})).json()) as { processes: { tag?: string }[] };
      assert.ok(!list.processes.some((p) => p.tag === 'sleeper'), JSON.stringify(list));
    });

    test('a stream whose client stops reading is cut off once 16 MiB wait for it, not held in the server', async () => {
      const url = new URL(server.url);
      const body = messageEnvelope({ process: { cmd: '/bin/sh', args: ['-c', 'yes >&2 & yes'] }, tag: 'flooder' });
      // The server's side of this connection, found by its port: a paused client sees no hang-up.
      const accepted: Socket[] = [];
      const onConnection = (s: Socket): void => void accepted.push(s);
      server.dsec.app.server.on('connection', onConnection);
      const socket = connect(Number(url.port), url.hostname, () =>
        socket.write(
          `POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n` +
            `E2b-Sandbox-Id: ${sandboxId}\r\nX-Access-Token: ${token}\r\nAuthorization: ${ROOT}\r\nContent-Length: ${body.length}\r\n\r\n`,
        ),
      );
      socket.once('connect', () => socket.write(body));
      const started = new Promise<void>((r) => socket.once('data', () => r()));
      socket.once('data', () => socket.pause()); // read nothing past the first bytes
      try {
        await started;
        const ours = accepted.find((s) => s.remotePort === socket.localPort);
        assert.ok(ours, 'the server accepted this connection');
        // Two streams of output (16 MiB each, as base64) are more than may wait unread: the server
        // hangs up (a guard against a hang, not a timing: without the cut it never does).
        const outcome = await Promise.race([
          new Promise<string>((r) => (ours.destroyed ? r('closed') : ours.once('close', () => r('closed')))),
          new Promise<string>((r) => setTimeout(() => r('still open after 60 s'), 60_000).unref()),
        ]);
        assert.equal(outcome, 'closed');
      } finally {
        server.dsec.app.server.off('connection', onConnection);
        socket.destroy();
        // A client that only went away leaves its process running (E2B's rule): end it here.
        await unary('process.Process/SendSignal', { process: { tag: 'flooder' }, signal: 'SIGNAL_SIGKILL' });
      }
    });

    test('bad input to the REST side is a 4xx with {code, message}; unsupported calls are 501', async () => {
      const noTemplate = await rest('POST', '/sandboxes', {});
      assert.equal(noTemplate.status, 400);
      assert.match(((await noTemplate.json()) as { message: string }).message, /templateID is required/);
      const badTimeout = await rest('POST', `/sandboxes/${sandboxId}/timeout`, { timeout: -1 });
      assert.equal(badTimeout.status, 400);
      const deny = await rest('POST', '/sandboxes', { templateID: 'busybox', network: { denyOut: ['10.0.0.0/8'] } });
      assert.equal(deny.status, 400);
      assert.match(((await deny.json()) as { message: string }).message, /denyOut supports only 0\.0\.0\.0\/0/);
      const notFound = await rest('GET', '/sandboxes/sb-nope-0000000000000');
      assert.deepEqual([notFound.status, ((await notFound.json()) as { code: number }).code], [404, 404]);
      const templates = await rest('GET', '/templates');
      assert.equal(templates.status, 501);
      const noKey = await fetch(`${server.url}/v2/sandboxes`);
      assert.equal(noKey.status, 401);
      // a dsec key opens the E2B API too; an e2b key opens dsec's
      assert.equal((await fetch(`${server.url}/v2/sandboxes`, { headers: { 'x-api-key': server.apiKey } })).status, 200);
      assert.equal((await fetch(`${server.url}/v1/sandboxes/${sandboxId}`, { headers: { authorization: `Bearer ${key}` } })).status, 200);
    });
  });
}
