import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConnectError } from './connect-protocol.js';
import { metadataOf } from './sandbox-routes.js';

test("a write's metadata is its X-Metadata-* headers, checked as envd checks them", () => {
  assert.deepEqual(metadataOf({ 'x-metadata-run-id': 'r-1', 'x-metadata-step': '3', 'content-type': 'text/plain' }), {
    'run-id': 'r-1',
    step: '3',
  });
  assert.deepEqual(metadataOf({ host: 'x' }), {});
  const refused = (headers: Record<string, string>, why: RegExp): void =>
    assert.throws(
      () => metadataOf(headers),
      (err: unknown) => err instanceof ConnectError && err.code === 'invalid_argument' && why.test(err.message),
    );
  refused({ [`x-metadata-${'k'.repeat(247)}`]: 'v' }, /over 246 bytes/);
  refused({ 'x-metadata-note': 'caf\u00e9' }, /not printable ASCII/);
  refused({ 'x-metadata-note': 'line\nbreak' }, /not printable ASCII/);
  const big: Record<string, string> = {};
  for (let i = 0; i < 5; i++) big[`x-metadata-k${i}`] = 'v'.repeat(900);
  refused(big, /over 4096/);
});
