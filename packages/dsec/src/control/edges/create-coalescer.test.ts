import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, GroupCreateListener } from '../../edge/protocol/edge-api.js';
import type { EdgeCreateOutcome, EdgeCreateRequest, EdgeSandbox } from '../../edge/protocol/schemas.js';
import { CreateCoalescer } from './create-coalescer.js';

/** An edge that records its calls: ids starting with `bad` fail, `gone` makes the whole group call fail. */
function fakeEdge(calls: string[]): EdgeApi {
  const sandbox = (id: string): EdgeSandbox => ({ id, status: 'running', pid: 1, createdAt: new Date(0).toISOString() });
  return {
    createSandbox: async (r: EdgeCreateRequest) => {
      calls.push(`one ${r.id}`);
      if (r.id.startsWith('bad')) throw new ApiError('NODE_DISK_FULL', 'full', { admission: true });
      return sandbox(r.id);
    },
    createSandboxes: async (rs: EdgeCreateRequest[]): Promise<EdgeCreateOutcome[]> => {
      calls.push(`group ${rs.map((r) => r.id).join(',')}`);
      if (rs.some((r) => r.id === 'gone')) throw new ApiError('EDGE_UNAVAILABLE', 'connection reset', { edge: 'e' });
      return rs.map((r) =>
        r.id.startsWith('bad')
          ? { id: r.id, error: { code: 'NODE_DISK_FULL', message: 'full', details: { admission: true } } }
          : { id: r.id, sandbox: sandbox(r.id) },
      );
    },
  } as unknown as EdgeApi;
}

const req = (id: string): EdgeCreateRequest => ({ id }) as EdgeCreateRequest;

test('concurrent creates for a remote edge go as one group; each gets its own outcome', async () => {
  const calls: string[] = [];
  const c = new CreateCoalescer({ api: () => fakeEdge(calls), isLocal: () => false });
  const out = await Promise.allSettled([c.create('e', req('a')), c.create('e', req('bad1')), c.create('e', req('b'))]);
  assert.deepEqual(calls, ['group a,bad1,b']);
  assert.equal(out[0].status === 'fulfilled' && out[0].value.id, 'a');
  assert.ok(out[1].status === 'rejected' && out[1].reason instanceof ApiError && out[1].reason.code === 'NODE_DISK_FULL');
  assert.deepEqual(out[1].status === 'rejected' && (out[1].reason as ApiError).details, { admission: true });
  assert.equal(out[2].status === 'fulfilled' && out[2].value.id, 'b');
  // a lone create is a plain create
  await c.create('e', req('c'));
  assert.equal(calls.at(-1), 'one c');
});

test('a group call that fails gives each create an error of its own; an in-process edge is called directly', async () => {
  const calls: string[] = [];
  const c = new CreateCoalescer({ api: () => fakeEdge(calls), isLocal: (id) => id === 'local' });
  const out = await Promise.allSettled([c.create('e', req('gone')), c.create('e', req('x'))]);
  const errs = out.map((o) => (o.status === 'rejected' ? (o.reason as ApiError) : undefined));
  assert.ok(errs[0] && errs[1] && errs[0] !== errs[1], 'distinct error objects');
  errs[0]!.details['sandboxId'] = 'gone';
  assert.equal(errs[1]!.details['sandboxId'], undefined, "one caller's details do not leak into another's");
  await Promise.all([c.create('local', req('l1')), c.create('local', req('l2'))]);
  assert.deepEqual(calls.slice(-2), ['one l1', 'one l2']);
});

test("a group's creates are answered as the edge settles each, not when its slowest is done", async () => {
  let finish!: () => void;
  const slow = new Promise<void>((r) => (finish = r));
  const sandbox = (id: string): EdgeSandbox => ({ id, status: 'running', pid: 1, createdAt: new Date(0).toISOString() });
  const edge = {
    createSandboxes: async (rs: EdgeCreateRequest[], listener?: GroupCreateListener): Promise<EdgeCreateOutcome[]> => {
      listener?.outcome?.(1, { id: rs[1]!.id, sandbox: sandbox(rs[1]!.id) });
      await slow;
      return rs.map((r) => ({ id: r.id, sandbox: sandbox(r.id) }));
    },
  } as unknown as EdgeApi;
  const c = new CreateCoalescer({ api: () => edge, isLocal: () => false });
  const first = c.create('e', req('slow'));
  let fast: string | undefined;
  void c.create('e', req('fast')).then((s) => (fast = s.id));
  for (let i = 0; i < 10 && fast === undefined; i++) await new Promise((r) => setImmediate(r));
  assert.equal(fast, 'fast', 'answered while the group call is still out');
  finish();
  assert.equal((await first).id, 'slow');
});
