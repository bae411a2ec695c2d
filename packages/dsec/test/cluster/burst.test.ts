/**
 * Bursting as DSec does it (issue 33), on a real cluster: two edges in the default pool (4 slots
 * each) and one in the `burst` pool, `dsec control --burst-return`. Above 80 % of the default
 * pool's slots, a new burstable create lands on the burst edge and the longest-idle burstable
 * sandbox moves there with its files; once the pool has room again it comes back.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { Sandbox, type SandboxInfo } from '@dsec/sdk';
import { assertCleanAndRemove, integrationSkipReason } from '../helpers/server.js';
import { ClusterHarness } from './support/cluster-harness.js';

function skipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (spawnSync('nsenter', ['--version']).status !== 0) return 'the cluster harness needs nsenter (util-linux)';
  return undefined;
}

describe('bursting: idle burstable sandboxes move to the burst pool above 80 % and back', { skip: skipReason(), timeout: 600_000 }, () => {
  const h = new ClusterHarness();
  let conn: { url: string; apiKey: string };

  before(async () => {
    await h.start(3, {
      lostAfterMs: 4000,
      controlArgs: ['--burst-return'],
      edgeArgs: (i) => (i === 2 ? ['--pool', 'burst', '--max-sandboxes', '20'] : ['--max-sandboxes', '4']),
    });
    conn = h.conn;
  });

  after(async () => {
    await h.close();
    for (const e of h.edges) await assertCleanAndRemove(e.dataDir, e.id);
    await assertCleanAndRemove(h.controlDir, 'none');
  });

  test('above the threshold: a new burstable create and the longest-idle burstable sandbox go to the burst edge; with room again it comes back', async () => {
    const burstEdge = h.edges[2]!.id;
    const spec = { ...conn, image: 'busybox', resources: { memoryMiB: 32 }, placement: { burst: true } };
    // 7 of the default pool's 8 slots: 87.5 %, above 80 %. One at a time: each create sees the last one's slot.
    const home: Sandbox[] = [];
    for (let i = 0; i < 7; i++) {
      const sb = await Sandbox.create(spec);
      await sb.files.write('/root/n', String(i));
      home.push(sb);
    }
    assert.ok(
      home.every((s) => s.info.edge !== burstEdge),
      `the first 7 fit in the default pool: ${home.map((s) => s.info.edge).join(' ')}`,
    );
    // A new burstable create, while the pool is above its threshold, goes to the burst edge itself.
    const extra = await Sandbox.create(spec);
    assert.equal(extra.info.edge, burstEdge);
    await extra.kill();
    const oldest = home[0]!;
    // Every other one was used since: the oldest is the longest idle.
    for (const sb of home.slice(1)) await sb.commands.run('true');
    const info = async (s: Sandbox): Promise<SandboxInfo> => s.refresh();
    await h.waitFor(
      async () => (await info(oldest)).edge === burstEdge,
      'the longest-idle burstable sandbox moved to the burst edge',
      () => h.controlLog.join('').slice(-4000),
    );
    assert.equal((await oldest.commands.run('cat /root/n')).stdout, '0');
    const moved = (await oldest.trajectory()).entries.find((e) => e.kind === 'sandbox.migrated');
    assert.equal(moved?.request['cause'], 'burst');
    assert.equal(moved?.request['to'], burstEdge);
    // Room again (3 of 8): the moved one comes back to its own pool.
    await Promise.all(home.slice(3).map((s) => s.kill()));
    await h.waitFor(
      async () => (await info(oldest)).edge !== burstEdge,
      'the sandbox came back from the burst pool',
      () => h.controlLog.join('').slice(-4000),
    );
    assert.equal((await oldest.commands.run('cat /root/n')).stdout, '0');
    const kinds = (await oldest.trajectory()).entries.filter((e) => e.kind === 'sandbox.migrated').map((e) => e.request['cause']);
    assert.deepEqual(kinds, ['burst', 'return']);
    const metrics = await (await fetch(`${conn.url}/metrics`, { headers: { authorization: `Bearer ${conn.apiKey}` } })).text();
    assert.match(metrics, /dsec_sandbox_migrations_total\{cause="burst",result="moved"\} [1-9]/);
    assert.match(metrics, /dsec_sandbox_migrations_total\{cause="return",result="moved"\} [1-9]/);
    await Promise.all(home.slice(0, 3).map((s) => s.kill()));
  });
});
