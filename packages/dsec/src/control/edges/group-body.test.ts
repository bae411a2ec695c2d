import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EdgeCreateRequest } from '../../edge/protocol/schemas.js';
import { groupBody } from './group-body.js';

const layers = ['sha256:' + 'a'.repeat(64), 'sha256:' + 'b'.repeat(64)];
const config = { env: ['PATH=/bin', 'Q="quoted"\n'], cmd: ['sh', '-c', 'echo ✓'], workingDir: '/' };
const limits = { cpu: 0.5, memoryMiB: 64, pids: 64 };
const env = { A: '1', 'B\u2028': 'x\\y' };
const same = (reqs: unknown[]): void => {
  const items = reqs as EdgeCreateRequest[];
  assert.equal(groupBody(items), JSON.stringify({ sandboxes: items }));
};

test("a group of one spec's items (all but the id shared) is the text JSON.stringify writes", () => {
  same(Array.from({ length: 5 }, (_, i) => ({ id: `sb-e1-z${i}`, layers, config, env, limits, backend: 'container' })));
  same([]);
  same([{ id: 'sb-e1-z1', layers, config, env, limits, backend: 'container' }]);
});

test('items that differ from the one before in any key or value but the id are written whole', () => {
  same([
    { id: 'sb-e1-z1', layers, config, env, limits, backend: 'container' },
    { id: 'sb-e1-z2', layers, config, env, limits, backend: 'container', network: { mode: 'none' } },
    { id: 'sb-e1-z3', layers, config, env, limits, backend: 'container', network: { mode: 'none' } }, // a new network object
    { id: 'sb-e1-z4', layers: [...layers], config, env, limits, backend: 'container' }, // equal, not the same object
    { id: 'sb-e1-z5', layers, config, env, limits, backend: 'vm' },
    { id: 'sb-e1-z6', config, layers, env, limits, backend: 'vm' }, // another key order
    { id: 'sb-e1-z7', config, layers, env, limits, backend: 'vm' },
  ]);
});

test('values with no JSON are left out, as JSON.stringify leaves them out, wherever they are', () => {
  same([
    { id: 'sb-e1-z1', layers, config, env: {}, limits, backend: 'container', volumes: undefined },
    { id: 'sb-e1-z2', layers, config, env: {}, limits, backend: 'container', volumes: undefined },
    { id: undefined, layers, limits },
    { id: undefined, layers, limits },
    { layers, id: 'sb-e1-z3' },
    { id: 'sb-e1-z4', layers: [1, undefined, NaN, null], limits: { cpu: Infinity } },
    {},
  ]);
});
