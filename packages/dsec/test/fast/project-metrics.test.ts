/**
 * Per-project metrics at /metrics, in process (support/in-process-control.ts): sandboxes by
 * project and state, creates, function calls and pool claims, each with a `project` label, made
 * through the API with each project's own key.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import type { PoolInfo, SandboxInfo } from '@dsec/sdk/schema';
import { parsePromText, type Scrape } from '../../src/cli/top/prom-text.js';
import { startInProcessControl, type InProcessControl } from './support/in-process-control.js';

describe('fast tier: per-project metrics', () => {
  let dsec: InProcessControl;
  before(async () => {
    dsec = await startInProcessControl();
  });
  after(async () => {
    await dsec?.close();
  });

  const scrape = async (): Promise<Scrape> => {
    const res = await dsec.call('GET', '/metrics');
    assert.equal(res.statusCode, 200);
    return parsePromText(res.body);
  };
  const create = async (key: string, body: object = {}): Promise<SandboxInfo> => {
    const res = await dsec.call('POST', '/v1/sandboxes', key, { image: 'busybox', resources: { memoryMiB: 64 }, ...body });
    assert.equal(res.statusCode, 201, res.body);
    return res.json() as SandboxInfo;
  };

  test('sandboxes by project and state, creates and fn calls per project', async () => {
    const { keys, call } = dsec;
    const a = [await create(keys.a), await create(keys.a), await create(keys.a)];
    const b = [await create(keys.b)];
    // The simulated edge pauses nothing: the row is moved as a pause would move it.
    await dsec.store.sandboxes.setStatus(a[2]!.id, 'paused');
    // The simulated edge runs no function calls: the call is counted with the error it answered.
    const fn = await call('POST', '/v1/fn/run', keys.b, { runtime: 'python', code: 'print(1)', image: 'busybox' });
    assert.equal(fn.statusCode, 503, fn.body);

    const m = await scrape();
    assert.equal(m.get('dsec_project_sandboxes', { project: 'team-a', state: 'running' }), 2);
    assert.equal(m.get('dsec_project_sandboxes', { project: 'team-a', state: 'paused' }), 1);
    assert.equal(m.get('dsec_project_sandboxes', { project: 'team-b', state: 'running' }), 1);
    assert.equal(m.get('dsec_project_sandboxes', { project: 'team-b', state: 'paused' }), undefined, 'no series for an empty group');
    assert.equal(m.get('dsec_project_sandbox_creates_total', { project: 'team-a' }), 3);
    assert.equal(m.get('dsec_project_sandbox_creates_total', { project: 'team-b' }), 1);
    assert.equal(m.get('dsec_project_fn_calls_total', { project: 'team-b', outcome: 'CAPACITY_EXCEEDED' }), 1);
    assert.equal(m.sum('dsec_project_fn_calls_total', { project: 'team-a' }), 0);
    // The cluster-wide gauge is the same grouped count, summed over projects.
    assert.equal(m.sum('dsec_sandboxes', { state: 'running' }), 3);
    assert.equal(m.get('dsec_events_last_minute', { event: 'create' }), 4, "the last minute's creates (dsec top --once)");
    assert.match((await call('GET', '/metrics')).body, /^# TYPE dsec_project_sandbox_creates_total counter$/m);

    for (const s of [...a, ...b]) assert.equal((await call('DELETE', `/v1/sandboxes/${s.id}`, keys.admin)).statusCode, 204);
    const later = await scrape();
    assert.equal(later.sum('dsec_project_sandboxes', { state: 'running' }), 0, 'killed sandboxes leave the gauge');
    assert.equal(later.get('dsec_project_sandbox_creates_total', { project: 'team-a' }), 3, 'a counter keeps counting past the kills');
  });

  test('a claim from a warm pool counts for the claiming project and the pool; its refill create for the pool’s', async () => {
    const { keys, call } = dsec;
    const before = await scrape();
    const made = await call('POST', '/v1/pools', keys.admin, { name: 'warm', size: 1, image: 'busybox', resources: { memoryMiB: 64 } });
    assert.equal(made.statusCode, 201, made.body);
    try {
      for (let i = 0; (((await call('GET', '/v1/pools/warm', keys.admin)).json() as PoolInfo).ready ?? 0) < 1; i++) {
        assert.ok(i < 200, 'the pool filled within 10 s');
        await sleep(50);
      }
      const claimed = await create(keys.b, { pool: 'warm' });
      assert.equal(claimed.project, 'team-b');
      const m = await scrape();
      assert.equal(m.get('dsec_project_pool_claims_total', { project: 'team-b', pool: 'warm' }), 1);
      assert.equal(m.get('dsec_project_pool_claims_total', { project: 'team-a', pool: 'warm' }), undefined);
      assert.equal(
        m.sum('dsec_project_sandbox_creates_total', { project: 'team-b' }) -
          before.sum('dsec_project_sandbox_creates_total', { project: 'team-b' }),
        0,
        'a claim is not a create of the claiming project',
      );
      assert.ok(
        m.sum('dsec_project_sandbox_creates_total', { project: 'default' }) >= 1,
        "the refill's create is the pool's (default project)",
      );
      assert.equal(m.get('dsec_project_sandboxes', { project: 'team-b', state: 'running' }), 1);
      assert.equal((await call('DELETE', `/v1/sandboxes/${claimed.id}`, keys.admin)).statusCode, 204);
    } finally {
      assert.equal((await call('DELETE', '/v1/pools/warm', keys.admin)).statusCode, 204);
    }
  });
});
