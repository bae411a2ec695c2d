import assert from 'node:assert/strict';
import { test } from 'node:test';
import { bearerMatches, presentedKey, withoutCredential } from './credentials.js';

test('the Authorization header wins over X-API-Key and anything offered as a subprotocol', () => {
  assert.equal(
    presentedKey({
      authorization: 'Bearer a',
      'x-api-key': 'x',
      upgrade: 'websocket',
      'sec-websocket-protocol': 'dsec.pty, dsec.bearer.b',
    }),
    'a',
  );
  // A malformed Authorization is no key at all, not a fall-back to another header.
  assert.equal(presentedKey({ authorization: 'Basic Zm9v', 'x-api-key': 'x' }), undefined);
  assert.equal(presentedKey({ 'x-api-key': 'e2b_k' }), 'e2b_k');
});

test('a WebSocket upgrade without the header: the key offered as dsec.bearer.<key>', () => {
  assert.equal(presentedKey({ upgrade: 'WebSocket', 'sec-websocket-protocol': 'dsec.pty, dsec.bearer.dsec_Ab-9_x' }), 'dsec_Ab-9_x');
});

test('a plain request never takes a key from Sec-WebSocket-Protocol, and no offer means no key', () => {
  assert.equal(presentedKey({ 'sec-websocket-protocol': 'dsec.bearer.k' }), undefined);
  assert.equal(presentedKey({ upgrade: 'websocket', 'sec-websocket-protocol': 'dsec.pty' }), undefined);
  assert.equal(presentedKey({ upgrade: 'websocket' }), undefined);
});

test('bearerMatches compares the whole token', () => {
  assert.equal(bearerMatches('Bearer dsecjoin_a', 'dsecjoin_a'), true);
  assert.equal(bearerMatches('bearer  dsecjoin_a', 'dsecjoin_a'), true);
  assert.equal(bearerMatches('Bearer dsecjoin_', 'dsecjoin_a'), false);
  assert.equal(bearerMatches(undefined, 'dsecjoin_a'), false);
});

test('no credential dsec reads leaves for a sandbox, whatever header carries it', () => {
  for (const h of ['Authorization', 'X-API-Key', 'x-access-token', 'X-Access-Token'])
    assert.equal(withoutCredential(h, 'secret'), undefined, h);
  assert.equal(withoutCredential('Sec-WebSocket-Protocol', 'chat, dsec.bearer.dsec_k, graphql-ws'), 'chat, graphql-ws');
  assert.equal(withoutCredential('Sec-WebSocket-Protocol', 'dsec.bearer.dsec_k'), undefined);
  assert.equal(withoutCredential('Accept', 'text/html'), 'text/html');
});
