/** What the SDK puts on the wire, checked against a local HTTP server that records requests. */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import { CommandExitError, InvalidRequestError } from './errors.js';
import { Sandbox } from './sandbox.js';

interface Seen {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

const INFO = {
  id: 'sb-local-abcdefabcdefa',
  edge: 'local',
  backend: 'container',
  status: 'running',
  image: 'busybox',
  imageId: `sha256:${'0'.repeat(64)}`,
  resources: { cpu: 1, memoryMiB: 512, pids: 512 },
  labels: {},
  createdAt: '2025-01-01T00:00:00.000Z',
};

const RESULT = {
  exitCode: 0,
  stdout: 'hi\n',
  stderr: '',
  encoding: 'utf8',
  truncated: false,
  stdoutBytes: 3,
  stderrBytes: 0,
  timedOut: false,
  durationMs: 1,
};

describe('SDK requests', () => {
  let server: Server;
  let url: string;
  let seen: Seen[];
  let reply: (req: IncomingMessage, res: ServerResponse) => void;

  const json = (res: ServerResponse, status: number, body: unknown): void => {
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  };

  before(async () => {
    server = createServer((req, res) => {
      res.setHeader('connection', 'close'); // no keep-alive: each call gets a fresh socket
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const u = new URL(req.url!, 'http://x');
        seen.push({ method: req.method!, path: u.pathname, query: u.searchParams, headers: req.headers, body: Buffer.concat(chunks) });
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
    reply = (req, res) => {
      if (req.url!.includes('/exec')) json(res, 200, RESULT);
      else if (req.method === 'POST' && req.url === '/v1/sandboxes') json(res, 201, INFO);
      else if (req.url!.startsWith('/v1/sandboxes?')) json(res, 200, { sandboxes: [INFO] });
      else if (req.method === 'PUT') json(res, 200, { path: '/x', bytes: 1 });
      else if (req.method === 'DELETE') res.writeHead(204).end();
      else json(res, 200, INFO);
    };
  });

  const opts = () => ({ url, apiKey: 'k' });
  const body = (i = 0): Record<string, unknown> => JSON.parse(seen[i]!.body.toString()) as Record<string, unknown>;

  test('create posts the spec with image busybox by default', async () => {
    const sb = await Sandbox.create({ ...opts(), resources: { memoryMiB: 64 }, labels: { a: 'b' } });
    assert.equal(sb.id, INFO.id);
    assert.equal(seen[0]!.method, 'POST');
    assert.equal(seen[0]!.path, '/v1/sandboxes');
    assert.deepEqual(body(), { image: 'busybox', resources: { memoryMiB: 64 }, labels: { a: 'b' } });
  });

  test('create never sends the connection options (url, apiKey, timeouts) in the body', async () => {
    await Sandbox.create({ ...opts(), requestTimeoutMs: 5000, timeoutMs: 5000 });
    const sent = seen[0]!.body.toString();
    assert.ok(!sent.includes('apiKey') && !sent.includes('"k"'), sent);
    assert.deepEqual(body(), { image: 'busybox' });
  });

  test('connect GETs the sandbox by id', async () => {
    await Sandbox.connect(INFO.id, opts());
    assert.equal(seen[0]!.method, 'GET');
    assert.equal(seen[0]!.path, `/v1/sandboxes/${INFO.id}`);
  });

  test('list sends one label=k=v per label', async () => {
    await Sandbox.list({ ...opts(), labels: { team: 'a', run: 'r 1' } });
    assert.deepEqual(seen[0]!.query.getAll('label').sort(), ['run=r 1', 'team=a']);
  });

  test('kill sends DELETE', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    await sb.kill();
    assert.equal(seen[1]!.method, 'DELETE');
    assert.equal(seen[1]!.path, `/v1/sandboxes/${INFO.id}`);
  });

  test('commands.run posts cmd and its options', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    const r = await sb.commands.run(['echo', 'hi'], { cwd: '/tmp', env: { A: '1' }, stdin: 'in', maxOutputBytes: 10 });
    assert.equal(r.stdout, 'hi\n');
    assert.equal(seen[1]!.path, `/v1/sandboxes/${INFO.id}/exec`);
    assert.deepEqual(body(1), { cmd: ['echo', 'hi'], cwd: '/tmp', env: { A: '1' }, stdin: 'in', maxOutputBytes: 10 });
  });

  test('commands.run passes timeoutMs to the server as the command timeout', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    await sb.commands.run('sleep 100', { timeoutMs: 500 });
    assert.equal(body(1)['timeoutMs'], 500, `exec body was ${seen[1]!.body.toString()}`);
  });

  test('commands.run with throwOnError throws CommandExitError on a non-zero exit', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    reply = (_req, res) => json(res, 200, { ...RESULT, exitCode: 2, stdout: 'o', stderr: 'e' });
    await assert.rejects(
      sb.commands.run('false', { throwOnError: true }),
      (err: unknown) => err instanceof CommandExitError && err.exitCode === 2,
    );
  });

  test('files.write PUTs raw bytes with the path and an octal mode', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    await sb.files.write('/tmp/a b', new Uint8Array([1, 0, 255]), { mode: 0o750 });
    const put = seen[1]!;
    assert.equal(put.method, 'PUT');
    assert.equal(put.path, `/v1/sandboxes/${INFO.id}/files`);
    assert.equal(put.query.get('path'), '/tmp/a b');
    assert.equal(put.query.get('mode'), '750');
    assert.equal(put.headers['content-type'], 'application/octet-stream');
    assert.deepEqual([...put.body], [1, 0, 255]);
  });

  test('files.write of a string sends its UTF-8 bytes and no mode by default', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    await sb.files.write('/x', 'é');
    assert.deepEqual([...seen[1]!.body], [0xc3, 0xa9]);
    assert.equal(seen[1]!.query.has('mode'), false);
  });

  test('files.read GETs the path and returns the bytes', async () => {
    const sb = await Sandbox.connect(INFO.id, opts());
    reply = (_req, res) => res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(Buffer.from([0, 1, 255]));
    const bytes = await sb.files.read('/etc/x');
    assert.deepEqual([...bytes], [0, 1, 255]);
    assert.equal(seen.at(-1)!.query.get('path'), '/etc/x');
  });

  // --- checks at the SDK's edge: JavaScript callers' wrong types fail before anything is sent ---

  /** Calls `fn` as untyped JavaScript would and expects an InvalidRequestError naming `field`, with no request sent. */
  const refused = async (fn: (sb: Sandbox) => Promise<unknown>, field: string, message: RegExp): Promise<void> => {
    const sb = await Sandbox.connect(INFO.id, opts());
    const before = seen.length;
    await assert.rejects(fn(sb), (err: unknown) => {
      assert.ok(err instanceof InvalidRequestError, `expected InvalidRequestError, got ${String(err)}`);
      assert.equal(err.code, 'INVALID_REQUEST');
      assert.equal(err.details['field'], field);
      assert.match(err.message, message);
      return true;
    });
    assert.equal(seen.length, before, 'a request was sent');
  };
  /* eslint-disable @typescript-eslint/no-explicit-any -- these calls are what untyped JavaScript passes */

  test("commands.run('echo hi', {timeoutMs: '5000'}) → InvalidRequestError naming timeoutMs", async () => {
    await refused(
      (sb) => sb.commands.run('echo hi', { timeoutMs: '5000' as any }),
      'timeoutMs',
      /timeoutMs must be integer, got the string "5000"/,
    );
  });

  test('commands.run(123) → InvalidRequestError naming cmd, not sh -c 123', async () => {
    await refused(
      (sb) => sb.commands.run(123 as any),
      'cmd',
      /cmd must be a shell command string or an argv array of strings, got number 123/,
    );
  });

  test('commands.run with an argv holding a number → names the item', async () => {
    await refused((sb) => sb.commands.run(['echo', 5 as any]), 'cmd[1]', /must be a string/);
  });

  test('commands.run with an unknown option (timeout for timeoutMs) → names it', async () => {
    await refused((sb) => sb.commands.run('true', { timeout: 5 } as any), 'timeout', /timeout is not an option of commands.run/);
  });

  test('commands.stream and commands.start check too', async () => {
    await refused((sb) => sb.commands.stream('true', { maxOutputBytes: -1 }).next(), 'maxOutputBytes', /maxOutputBytes must be/);
    await refused((sb) => sb.commands.start({ cmd: 'x' } as any), 'cmd', /got an object/);
  });

  test('files.write(p, {a: 1}) → InvalidRequestError, not a file holding [object Object]', async () => {
    await refused(
      (sb) => sb.files.write('/tmp/x', { a: 1 } as any),
      'data',
      /data must be a string or a Uint8Array \(Buffer\), got an object \(Object\); serialize objects first/,
    );
  });

  test('files calls with a path that is not a string → InvalidRequestError naming path', async () => {
    await refused((sb) => sb.files.read(undefined as any), 'path', /path must be a non-empty string, got undefined/);
    await refused((sb) => sb.files.write('', 'x'), 'path', /non-empty/);
    await refused((sb) => sb.files.write('/x', 'x', { mode: '755' as any }), 'mode', /whole number/);
  });

  test('setNetwork with an unknown mode lists the modes', async () => {
    await refused(
      (sb) => sb.setNetwork({ mode: 'closed' } as any),
      'mode',
      /mode must be one of "none", "allow", "open", got the string "closed"/,
    );
  });

  test('Sandbox.create with a string memory limit → InvalidRequestError before any request', async () => {
    const before = seen.length;
    await assert.rejects(
      Sandbox.create({ ...opts(), resources: { memoryMiB: '64' as any } }),
      (err: unknown) => err instanceof InvalidRequestError && err.details['field'] === 'resources.memoryMiB',
    );
    assert.equal(seen.length, before);
  });
  /* eslint-enable @typescript-eslint/no-explicit-any */
});
