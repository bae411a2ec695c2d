import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import pino from 'pino';
import { SandboxIdParams } from '@dsec/sdk/schema';
import type { ImageStore } from '../image/image-store.js';
import { ControlPlane, DEFAULT_LIMITS, edgeOf, newSandboxId } from './control-plane.js';
import { StateStore } from './state-store.js';
import { testStoreLocation } from '../../test/helpers/postgres.js';

const ID_PATTERN = new RegExp((SandboxIdParams.properties.id as { pattern?: string }).pattern!);

describe('sandbox ids', () => {
  test('newSandboxId gives sb-<edge>-z<20 base-36 characters: the millisecond, then 56 random bits>', () => {
    assert.match(newSandboxId('local'), /^sb-local-z[0-9a-z]{20}$/);
  });

  test('every new id matches the id pattern the HTTP API accepts', () => {
    for (let i = 0; i < 500; i++) {
      const id = newSandboxId('edge7');
      assert.match(id, ID_PATTERN, id);
    }
  });

  test("ids sort by their creation millisecond (the store's id indexes take new rows at their end)", (t) => {
    const now = Date.now();
    t.mock.method(Date, 'now', () => now);
    const earlier = Array.from({ length: 50 }, () => newSandboxId('local'));
    t.mock.method(Date, 'now', () => now + 1);
    const later = Array.from({ length: 50 }, () => newSandboxId('local'));
    for (const a of earlier) for (const b of later) assert.ok(a < b, `${a} < ${b}`);
    // Ids of an older dsec (the creation second first) sort before every new one.
    assert.ok('sb-local-0tpnq5p0123456789a' < newSandboxId('local'));
  });

  test('ids are unique', () => {
    const ids = new Set(Array.from({ length: 5000 }, () => newSandboxId('local')));
    assert.equal(ids.size, 5000);
  });

  test('edgeOf decodes the edge from an id', () => {
    assert.equal(edgeOf(newSandboxId('local')), 'local');
    assert.equal(edgeOf(newSandboxId('n0de42')), 'n0de42');
    assert.equal(edgeOf('sb-e1-abcdef'), 'e1');
  });

  test('edgeOf of something that is not a sandbox id is undefined', () => {
    for (const bad of [
      '',
      'sb-',
      'sb-local',
      'sb-local-',
      'xx-local-abcdef',
      'sb-Local-abcdef',
      'sb-a-b-c',
      `sb-${'a'.repeat(33)}-abcdef`,
      'sb-local-abc/../x',
    ]) {
      assert.equal(edgeOf(bad), undefined, bad);
    }
  });
});

describe('ControlPlane.limitsFor', () => {
  // limitsFor uses no image: the image store is left out on purpose.
  let cp: ControlPlane;
  before(async () => {
    cp = new ControlPlane(
      await StateStore.open(await testStoreLocation(':memory:')),
      undefined as unknown as ImageStore,
      pino({ level: 'silent' }),
    );
  });

  test('defaults fill every limit not given', () => {
    assert.deepEqual(cp.sandboxes.limitsFor({ image: 'busybox' }), DEFAULT_LIMITS);
    assert.deepEqual(cp.sandboxes.limitsFor({ image: 'busybox', resources: { memoryMiB: 64 } }), { ...DEFAULT_LIMITS, memoryMiB: 64 });
  });
  // More memory than any node has is refused at placement, from the nodes' own reports
  // (placement.test.ts, and test/bad-input.test.ts through the API).
});
