 
/** What the SDK puts on the wire, checked against a local HTTP server that records requests. */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import { CommandExitError } from './errors.js';
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

const RESULT = { exitCode: 0, stdout: 'hi\n', stderr: '', encoding: 'utf8', truncated: false, stdoutBytes: 3, stderrBytes: 0, timedOut: false, durationMs: 1 };

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
    await assert.rejects(sb.commands.run('false', { throwOnError: true }), (err: unknown) => err instanceof CommandExitError && err.exitCode === 2);
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
});
