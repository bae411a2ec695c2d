import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EdgeCreateRequest } from '../../edge/protocol/schemas.js';
import { groupBody } from './group-body.js';

test('a group body is the text JSON.stringify writes, shared values and all', () => {
  const layers = ['sha256:' + 'a'.repeat(64), 'sha256:' + 'b'.repeat(64)];
  const config = { env: ['PATH=/bin', 'Q="quoted"\n'], cmd: ['sh', '-c', 'echo ✓'], workingDir: '/' };
  const limits = { cpu: 0.5, memoryMiB: 64, pids: 64 };
  const env = { A: '1', 'B\u2028': 'x\\y' };
  const reqs = [
    { id: 'sb-e1-z1', layers, config, env, limits, backend: 'container' },
    { id: 'sb-e1-z2', layers, config, env, limits, backend: 'container', network: { mode: 'none' } },
    // a value with no JSON is left out, as JSON.stringify leaves it out
    { id: 'sb-e1-z3', layers: [...layers], config, env: {}, limits, backend: 'container', volumes: undefined },
  ] as unknown as EdgeCreateRequest[];
  assert.equal(groupBody(reqs), JSON.stringify({ sandboxes: reqs }));
  assert.equal(groupBody([]), JSON.stringify({ sandboxes: [] }));
  assert.deepEqual(JSON.parse(groupBody(reqs)), { sandboxes: JSON.parse(JSON.stringify(reqs)) });
});
