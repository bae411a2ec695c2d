/**
 * Red team, input (issue 10, Low 10): a NUL byte in a command, its argv, its environment or a
 * session command was accepted and the command ran cut at the NUL, so what ran was not what the
 * trajectory logged (`echo ok\0; rm -rf /work` logs one thing and runs another). Each must be
 * refused with 400 INVALID_REQUEST before anything runs.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';

describe('red team: NUL bytes in commands', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
  });
  after(async () => {
    await server?.close();
  });

  for (const [name, body] of [
    ['a shell string', { cmd: 'echo ok\u0000; touch /tmp/ran' }],
    ['an argv', { cmd: ['sh', '-c', 'touch /tmp/ran\u0000'] }],
    ['an env value', { cmd: 'touch /tmp/ran', env: { X: 'a\u0000b' } }],
  ] as const) {
    test(`exec with a NUL in ${name}: 400, nothing runs`, async () => {
      const res = await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: body });
      const err = expectWireError(res, 400, 'INVALID_REQUEST');
      assert.match(err.message, /NUL/);
      assert.equal(await sb.files.exists('/tmp/ran'), false);
    });
  }

  test('a session command with a NUL: 400, nothing runs', async () => {
    const s = await sb.sessions.create();
    const res = await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/sessions/${s.id}/exec`, { json: { cmd: 'echo ok\u0000; touch /tmp/ran' } });
    const err = expectWireError(res, 400, 'INVALID_REQUEST');
    assert.match(err.message, /NUL/);
    assert.equal(await sb.files.exists('/tmp/ran'), false);
    await s.close();
  });
});
