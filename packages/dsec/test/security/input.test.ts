/**
 * Red team, input (issue 10, Low 10): a NUL byte in a command, its argv, its environment or a
 * session command was accepted and the command ran cut at the NUL, so what ran was not what the
 * trajectory logged (`echo ok\0; rm -rf /work` logs one thing and runs another). Each must be
 * refused with 400 INVALID_REQUEST before anything runs. Likewise a JSON body of the wrong type
 * (`cmd: 123`, which schema coercion used to run as the command "123"): JSON has types, so a
 * body is validated as it is; only a URL's query string and parameters, which are text, coerce.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';

describe('red team: NUL bytes and wrongly typed JSON in commands', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
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

  for (const [name, body] of [
    ['cmd: a number', { cmd: 123 }],
    ['cmd: a boolean', { cmd: true }],
    ['timeoutMs: a string', { cmd: 'touch /tmp/ran', timeoutMs: '5000' }],
    ['an env value that is a number', { cmd: 'touch /tmp/ran', env: { X: 1 } }],
  ] as const) {
    test(`exec with ${name}: 400 naming the field, nothing runs`, async () => {
      const res = await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: body });
      const err = expectWireError(res, 400, 'INVALID_REQUEST');
      assert.match(err.message, /cmd|timeoutMs|env/, err.message);
      assert.equal(await sb.files.exists('/tmp/ran'), false);
    });
  }

  test('query strings still coerce: ?recursive=true on a removal is the boolean true', async () => {
    await sb.files.write('/tmp/coerce/a/f', 'x');
    const res = await call(server.conn, 'DELETE', `/v1/sandboxes/${sb.id}/files?path=/tmp/coerce&recursive=true`);
    assert.equal(res.status, 204, res.text);
    assert.equal(await sb.files.exists('/tmp/coerce'), false);
  });

  test('a session command with a NUL: 400, nothing runs', async () => {
    const s = await sb.sessions.create();
    const res = await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/sessions/${s.id}/exec`, {
      json: { cmd: 'echo ok\u0000; touch /tmp/ran' },
    });
    const err = expectWireError(res, 400, 'INVALID_REQUEST');
    assert.match(err.message, /NUL/);
    assert.equal(await sb.files.exists('/tmp/ran'), false);
    await s.close();
  });
});
