import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PTY_PROTOCOL, selectSubprotocol } from './websocket-bearer.js';

test("the server answers with dsec.pty, never with the protocol that carries the key; other routes keep ws' first-offered default", () => {
  assert.equal(selectSubprotocol(new Set([PTY_PROTOCOL, 'dsec.bearer.k'])), PTY_PROTOCOL);
  assert.equal(selectSubprotocol(new Set(['dsec.bearer.k'])), false);
  assert.equal(selectSubprotocol(new Set(['dsec.bearer.k', 'graphql-ws', 'chat'])), 'graphql-ws');
});
