import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  ConnectError,
  decodeEnvelopes,
  encodeEnvelope,
  endStreamEnvelope,
  FLAG_END_STREAM,
  messageEnvelope,
  parseTimeoutMs,
  streamRequestMessage,
} from './connect-protocol.js';
import { e2bRewriteUrl } from './index.js';
import { fileSignature } from './sandbox-access.js';
import { userFromAuthorization } from './sandbox-users.js';

describe('Connect JSON framing', () => {
  test('an envelope is a flag byte, a big-endian length and the payload', () => {
    const env = messageEnvelope({ a: 1 });
    assert.equal(env[0], 0);
    assert.equal(env.readUInt32BE(1), 7);
    assert.equal(env.subarray(5).toString(), '{"a":1}');
  });

  test('envelopes round-trip, several in one body', () => {
    const body = Buffer.concat([messageEnvelope({ x: 'y' }), endStreamEnvelope()]);
    const envs = decodeEnvelopes(body);
    assert.equal(envs.length, 2);
    assert.deepEqual(JSON.parse(envs[0]!.payload.toString()), { x: 'y' });
    assert.equal(envs[1]!.flags, FLAG_END_STREAM);
    assert.deepEqual(JSON.parse(envs[1]!.payload.toString()), {});
  });

  test('the end-of-stream envelope carries the error', () => {
    const env = endStreamEnvelope(new ConnectError('not_found', 'no such process'));
    assert.equal(env[0], FLAG_END_STREAM);
    assert.deepEqual(JSON.parse(env.subarray(5).toString()), { error: { code: 'not_found', message: 'no such process' } });
  });

  test('truncated, compressed and multi-message requests are refused with invalid_argument or unimplemented', () => {
    const env = messageEnvelope({ a: 1 });
    assert.throws(
      () => decodeEnvelopes(env.subarray(0, 3)),
      (e: unknown) => e instanceof ConnectError && e.code === 'invalid_argument',
    );
    assert.throws(
      () => decodeEnvelopes(env.subarray(0, env.length - 1)),
      (e: unknown) => e instanceof ConnectError && e.code === 'invalid_argument',
    );
    assert.throws(
      () => decodeEnvelopes(encodeEnvelope(1, Buffer.from('x'))),
      (e: unknown) => e instanceof ConnectError && e.code === 'unimplemented',
    );
    assert.throws(() => streamRequestMessage(Buffer.concat([env, env])), /exactly one message/);
    assert.throws(() => streamRequestMessage(encodeEnvelope(0, Buffer.from('{nope'))), /not valid JSON/);
    assert.deepEqual(streamRequestMessage(env), { a: 1 });
  });

  test('Connect-Timeout-Ms is 1 to 10 digits', () => {
    assert.equal(parseTimeoutMs(undefined), undefined);
    assert.equal(parseTimeoutMs('60000'), 60000);
    assert.throws(() => parseTimeoutMs('12345678901'), ConnectError);
    assert.throws(() => parseTimeoutMs('-1'), ConnectError);
  });
});

describe('E2B request dispatch and credentials', () => {
  const req = (url: string, headers: Record<string, string> = {}): Parameters<typeof e2bRewriteUrl>[0] => ({ url, headers }) as never;

  test('E2b-Sandbox-Id sends a request to the sandbox side; without it nothing reaches there', () => {
    assert.equal(e2bRewriteUrl(req('/files?path=a', { 'e2b-sandbox-id': 'sb-x-1' })), '/e2b-sandbox/files?path=a');
    assert.equal(e2bRewriteUrl(req('/process.Process/Start', { 'e2b-sandbox-id': 'sb-x-1' })), '/e2b-sandbox/process.Process/Start');
    assert.equal(e2bRewriteUrl(req('/v1/sandboxes')), '/v1/sandboxes');
    assert.equal(e2bRewriteUrl(req('/sandboxes')), '/sandboxes');
    assert.notEqual(e2bRewriteUrl(req('/e2b-sandbox/files')), '/e2b-sandbox/files');
  });

  test('the user comes from Authorization: Basic base64(name:)', () => {
    assert.equal(userFromAuthorization(`Basic ${Buffer.from('root:').toString('base64')}`), 'root');
    assert.equal(userFromAuthorization(undefined), undefined);
    assert.equal(userFromAuthorization('Bearer x'), undefined);
  });

  test('file URL signatures are v1_ + unpadded base64 sha256 of path:op:user:token[:exp]', () => {
    const sig = fileSignature('/a.txt', 'read', 'user', 'tok');
    assert.match(sig, /^v1_[A-Za-z0-9+/]{43}$/);
    assert.notEqual(sig, fileSignature('/a.txt', 'write', 'user', 'tok'));
    assert.notEqual(sig, fileSignature('/a.txt', 'read', 'user', 'tok', 1));
  });
});
