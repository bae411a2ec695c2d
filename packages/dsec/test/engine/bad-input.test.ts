/* eslint-disable @typescript-eslint/no-explicit-any -- wire bodies are checked field by field */
/**
 * Bad input to the exec engine: empty commands, negative or absurd timeouts, unknown session and
 * process ids, stdin over the limit, bad terminal parameters. Each answers a clear 4xx error.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DsecError, Sandbox } from '@dsec/sdk';
import { MAX_STDIN_BYTES } from '@dsec/sdk/schema';
import { startTestServer, type TestServer } from '../helpers/server.js';
import { engineBackends } from '../helpers/vm.js';
import { callJson } from './support/http.js';

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: bad input (${backend})`, { skip, timeout: 300_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;
    let sid: string;

    /** Asserts a `{error:{code}}` answer with this status and code. */
    function expectError(r: { status: number; body: any }, status: number, code: string): void {
      assert.equal(r.status, status, `expected ${status} ${code}, got ${r.status}: ${JSON.stringify(r.body)?.slice(0, 300)}`);
      assert.equal(r.body?.error?.code, code, JSON.stringify(r.body)?.slice(0, 300));
      assert.ok(typeof r.body.error.message === 'string' && r.body.error.message.length > 0);
    }

    const exec = (body: unknown): Promise<{ status: number; body: any }> => callJson(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, body);
    const start = (body: unknown): Promise<{ status: number; body: any }> =>
      callJson(server, 'POST', `/v1/sandboxes/${sb.id}/processes`, body);
    const sessionExec = (body: unknown, id = sid): Promise<{ status: number; body: any }> =>
      callJson(server, 'POST', `/v1/sandboxes/${sb.id}/sessions/${id}/exec`, body);

    before(async () => {
      server = await startTestServer();
      sb = await Sandbox.create({ ...server.conn, backend, resources: { memoryMiB } });
      sid = (await sb.sessions.create()).id;
    });
    after(async () => {
      await server?.close();
    });

    test("exec with cmd '' → 400 INVALID_REQUEST (nothing runs)", async () => {
      expectError(await exec({ cmd: '' }), 400, 'INVALID_REQUEST');
      assert.deepEqual(
        (await sb.trajectory()).entries.filter(
          (e) => e.kind === 'exec' && (e.request['cmd'] === '' || JSON.stringify(e.request['cmd']) === '[""]'),
        ),
        [],
      );
    });

    test('exec with cmd [] → 400 INVALID_REQUEST', async () => {
      expectError(await exec({ cmd: [] }), 400, 'INVALID_REQUEST');
    });

    test("exec with cmd [''] (an empty program name) → 400 INVALID_REQUEST", async () => {
      expectError(await exec({ cmd: [''] }), 400, 'INVALID_REQUEST');
    });

    test("background process with cmd '' or [] → 400 INVALID_REQUEST", async () => {
      expectError(await start({ cmd: '' }), 400, 'INVALID_REQUEST');
      expectError(await start({ cmd: [] }), 400, 'INVALID_REQUEST');
    });

    test("session command '' → 400 INVALID_REQUEST", async () => {
      expectError(await sessionExec({ cmd: '' }), 400, 'INVALID_REQUEST');
    });

    for (const timeoutMs of [-1, 0, 1.5, 1e12, 'soon', null]) {
      test(`exec with timeoutMs ${JSON.stringify(timeoutMs)} → 400 INVALID_REQUEST`, async () => {
        const r = await exec({ cmd: 'true', timeoutMs });
        expectError(r, 400, 'INVALID_REQUEST');
        assert.equal(r.body.error.details.field, 'timeoutMs');
      });
    }

    test('session command and background process with a negative or absurd timeoutMs → 400', async () => {
      for (const timeoutMs of [-5, 0, 1e12]) {
        expectError(await sessionExec({ cmd: 'true', timeoutMs }), 400, 'INVALID_REQUEST');
        expectError(await start({ cmd: 'true', timeoutMs }), 400, 'INVALID_REQUEST');
      }
    });

    test('process wait with a negative timeoutMs → 400', async () => {
      const p = await sb.commands.start(['true']);
      expectError(
        await callJson(server, 'POST', `/v1/sandboxes/${sb.id}/processes/${p.id}/wait`, { timeoutMs: -1 }),
        400,
        'INVALID_REQUEST',
      );
    });

    test('negative maxOutputBytes → 400 on exec, session command and background process', async () => {
      expectError(await exec({ cmd: 'true', maxOutputBytes: -1 }), 400, 'INVALID_REQUEST');
      expectError(await sessionExec({ cmd: 'true', maxOutputBytes: -1 }), 400, 'INVALID_REQUEST');
      expectError(await start({ cmd: 'true', maxOutputBytes: -1 }), 400, 'INVALID_REQUEST');
    });

    test("an unknown encoding ('hex') → 400", async () => {
      expectError(await exec({ cmd: 'true', encoding: 'hex' }), 400, 'INVALID_REQUEST');
      expectError(await exec({ cmd: 'true', stdin: 'x', stdinEncoding: 'hex' }), 400, 'INVALID_REQUEST');
    });

    test('unknown session id → 404 SESSION_NOT_FOUND on exec; close answers 204 (idempotent: gone is gone)', async () => {
      expectError(await sessionExec({ cmd: 'true' }, 'ss-doesnotexist'), 404, 'SESSION_NOT_FOUND');
      assert.equal((await callJson(server, 'DELETE', `/v1/sandboxes/${sb.id}/sessions/ss-doesnotexist`)).status, 204);
    });

    test('a malformed session id → 400 INVALID_REQUEST', async () => {
      expectError(await sessionExec({ cmd: 'true' }, 'not-a-session'), 400, 'INVALID_REQUEST');
    });

    test('unknown process id → 404 PROCESS_NOT_FOUND; a malformed one → 400', async () => {
      expectError(await callJson(server, 'GET', `/v1/sandboxes/${sb.id}/processes/p-doesnotexist`), 404, 'PROCESS_NOT_FOUND');
      expectError(
        await callJson(server, 'POST', `/v1/sandboxes/${sb.id}/processes/p-doesnotexist/signal`, { signal: 'SIGTERM' }),
        404,
        'PROCESS_NOT_FOUND',
      );
      expectError(await callJson(server, 'GET', `/v1/sandboxes/${sb.id}/processes/not_a_process`), 400, 'INVALID_REQUEST');
    });

    test('an unknown signal name → 400', async () => {
      const p = await sb.commands.start(['sleep', '7001']);
      expectError(
        await callJson(server, 'POST', `/v1/sandboxes/${sb.id}/processes/${p.id}/signal`, { signal: 'SIGFOO' }),
        400,
        'INVALID_REQUEST',
      );
      await p.kill();
    });

    test('an unknown session shell → 400', async () => {
      expectError(await callJson(server, 'POST', `/v1/sandboxes/${sb.id}/sessions`, { shell: 'zsh' }), 400, 'INVALID_REQUEST');
    });

    test('session and process calls on an unknown sandbox → 404 SANDBOX_NOT_FOUND', async () => {
      const ghost = `sb-${server.edgeId}-ghost00000001`;
      expectError(await callJson(server, 'POST', `/v1/sandboxes/${ghost}/sessions`, {}), 404, 'SANDBOX_NOT_FOUND');
      expectError(await callJson(server, 'POST', `/v1/sandboxes/${ghost}/sessions/ss-abc/exec`, { cmd: 'true' }), 404, 'SANDBOX_NOT_FOUND');
      expectError(await callJson(server, 'POST', `/v1/sandboxes/${ghost}/processes`, { cmd: 'true' }), 404, 'SANDBOX_NOT_FOUND');
    });

    test(`stdin of MAX_STDIN_BYTES + 1 bytes (utf8) → 400 or 413, and the command does not run`, async () => {
      const r = await exec({ cmd: 'wc -c > /tmp/stdin-over-limit', stdin: 'a'.repeat(MAX_STDIN_BYTES + 1) });
      assert.ok(
        r.status === 400 || r.status === 413,
        `stdin over the ${MAX_STDIN_BYTES}-byte limit was accepted: HTTP ${r.status} ${JSON.stringify(r.body)?.slice(0, 200)}`,
      );
      assert.equal(await sb.files.exists('/tmp/stdin-over-limit'), false);
    });

    test('stdin in base64 that decodes to more than MAX_STDIN_BYTES → 400 or 413', async () => {
      const r = await exec({ cmd: 'wc -c', stdin: Buffer.alloc(MAX_STDIN_BYTES + 3).toString('base64'), stdinEncoding: 'base64' });
      assert.ok(r.status === 400 || r.status === 413, `HTTP ${r.status} ${JSON.stringify(r.body)?.slice(0, 200)}`);
    });

    test('stdin of exactly MAX_STDIN_BYTES is accepted and delivered whole', async () => {
      const r = await exec({ cmd: 'wc -c', stdin: 'b'.repeat(MAX_STDIN_BYTES) });
      assert.equal(r.status, 200, JSON.stringify(r.body)?.slice(0, 200));
      assert.equal(r.body.stdout.trim(), String(MAX_STDIN_BYTES));
    });

    test('a JSON body far over the limit (20 MiB of stdin) → 413 PAYLOAD_TOO_LARGE', async () => {
      expectError(await exec({ cmd: 'true', stdin: 'c'.repeat(20 << 20) }), 413, 'PAYLOAD_TOO_LARGE');
    });

    test('a terminal with rows 5000 (over the limit) is refused with HTTP 400', async () => {
      let err: unknown;
      try {
        const t = await sb.terminal({ cmd: ['/bin/sh'], rows: 5000, cols: 80, onData: () => {} });
        t.kill();
      } catch (e) {
        err = e;
      }
      assert.ok(err instanceof DsecError, String(err));
      assert.equal(err.status, 400);
    });

    test('after all the bad input the sandbox and its session still work', async () => {
      assert.equal((await sb.commands.run('echo fine')).stdout, 'fine\n');
      const r = await sessionExec({ cmd: 'echo session-fine' });
      assert.equal(r.body.stdout, 'session-fine\n');
    });
  });
