import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PTY_PROTOCOL, requestAuthorization, selectSubprotocol } from './websocket-bearer.js';

test('the Authorization header wins over anything offered as a subprotocol', () => {
  assert.equal(
    requestAuthorization({ authorization: 'Bearer a', upgrade: 'websocket', 'sec-websocket-protocol': 'dsec.pty, dsec.bearer.b' }),
    'Bearer a',
  );
});

test('a WebSocket upgrade without the header: the key offered as dsec.bearer.<key>', () => {
  assert.equal(
    requestAuthorization({ upgrade: 'WebSocket', 'sec-websocket-protocol': 'dsec.pty, dsec.bearer.dsec_Ab-9_x' }),
    'Bearer dsec_Ab-9_x',
  );
});

test('a plain request never takes a key from Sec-WebSocket-Protocol, and no offer means no key', () => {
  assert.equal(requestAuthorization({ 'sec-websocket-protocol': 'dsec.bearer.k' }), undefined);
  assert.equal(requestAuthorization({ upgrade: 'websocket', 'sec-websocket-protocol': 'dsec.pty' }), undefined);
  assert.equal(requestAuthorization({ upgrade: 'websocket' }), undefined);
});

test("the server answers with dsec.pty, never with the protocol that carries the key; other routes keep ws' first-offered default", () => {
  assert.equal(selectSubprotocol(new Set([PTY_PROTOCOL, 'dsec.bearer.k'])), PTY_PROTOCOL);
  assert.equal(selectSubprotocol(new Set(['dsec.bearer.k'])), false);
  assert.equal(selectSubprotocol(new Set(['dsec.bearer.k', 'graphql-ws', 'chat'])), 'graphql-ws');
});
