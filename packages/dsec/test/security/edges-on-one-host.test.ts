/**
 * Red team, two edges on one host (issue 10, Medium 6). A second edge started with the same id
 * deleted the first one's host guard table at start (a sandbox of the first then reached a host
 * listener); edges with different ids both handed out 169.254.1.0/30, so routes sent one edge's
 * traffic into the other's veth. Here: the second edge with a taken id refuses to start and the
 * first one's guard table is untouched; edges with different ids give their sandboxes links in
 * different blocks; a block goes back when its last link goes.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { CLAIMS_DIR, uidRangesOf } from '../../src/host/host-claims.js';
import { DEFAULT_USERNS_POOL } from '../../src/edge/backends/container/userns-pool.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec, TEST_USERNS } from '../helpers/server.js';
import { setNetwork } from './support/harness.js';

interface Started {
  dataDir: string;
  edgeId: string;
  dsec?: RunningDsec;
}

const conn = (s: Started): { url: string; apiKey: string } => ({ url: s.dsec!.url, apiKey: s.dsec!.apiKey });
const asServer = (s: Started) => ({ conn: conn(s) }) as never;

function guardTableExists(edgeId: string): boolean {
  return execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' }).includes(`dsec_host_${edgeId}`);
}

describe('red team: several edges on one host', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  const a: Started = { dataDir: '', edgeId: newEdgeId() };
  const b: Started = { dataDir: '', edgeId: newEdgeId() };

  before(async () => {
    a.dataDir = makeDataDir();
    b.dataDir = makeDataDir();
    a.dsec = await startDsec(a.dataDir, { edgeId: a.edgeId });
    b.dsec = await startDsec(b.dataDir, { edgeId: b.edgeId });
  });
  after(async () => {
    for (const s of [a, b]) {
      await s.dsec?.close({ killAll: true });
      if (s.dataDir) await assertCleanAndRemove(s.dataDir, s.edgeId);
    }
  });

  test('a second edge with a taken id refuses to start, and the first keeps its guard table', async () => {
    const sb = await Sandbox.create({ ...conn(a), resources: { memoryMiB: 64 } });
    await setNetwork(asServer(a), sb.id, { mode: 'open' });
    assert.ok(guardTableExists(a.edgeId), 'control: the first edge guards its link');
    const other = makeDataDir();
    try {
      await assert.rejects(startDsec(other, { edgeId: a.edgeId }), /edge id .* is already in use on this host/);
    } finally {
      // Its own leak check, not a's: a's sandbox is still alive (its cgroup would count against
      // `other` under a's id, and the failed cleanup left this dir behind in full runs).
      await assertCleanAndRemove(other, newEdgeId());
    }
    assert.ok(guardTableExists(a.edgeId), "the second edge removed the first one's host guard table");
    await sb.kill();
  });

  test(
    'edges with user namespaces made ahead never share a range: sandboxes and pooled namespaces of both hold disjoint ranges',
    { skip: TEST_USERNS ? undefined : 'DSEC_TEST_USERNS=0: no user namespaces' },
    async () => {
      const edges = [a, b].map((s) => s.dsec!.edge);
      const made = await Promise.all([a, b, a, b].map((s) => Sandbox.create({ ...conn(s), resources: { memoryMiB: 64 } })));
      try {
        await Promise.all(edges.map((e) => e.usernsPool.settled()));
        const slotsOf = (s: Started): number[] => uidRangesOf(s.edgeId).map((c) => c.slot);
        const [sa, sb] = [slotsOf(a), slotsOf(b)];
        assert.deepEqual(
          sa.filter((slot) => sb.includes(slot)),
          [],
          `both edges claim a range: ${JSON.stringify({ a: sa, b: sb })}`,
        );
        // Each sandbox's and each pooled namespace's range is claimed by its own edge.
        for (const [i, e] of edges.entries()) {
          const mine = i === 0 ? sa : sb;
          assert.equal(e.usernsPool.ready, DEFAULT_USERNS_POOL);
          const holders = uidRangesOf(i === 0 ? a.edgeId : b.edgeId).map((c) => c.sandboxId);
          for (const f of e.usernsPool.files())
            assert.ok(holders.includes(f.slice(f.lastIndexOf('/') + 1)), `pooled namespace ${f} is not on its edge's claims`);
          for (const slot of e.uidRanges.slots()) assert.ok(mine.includes(slot));
        }
      } finally {
        await Promise.all(made.map((s) => s.kill()));
      }
    },
  );

  test('edges with different ids give their sandboxes links in different blocks; a block goes back with its last link', async () => {
    const sa = await Sandbox.create({ ...conn(a), resources: { memoryMiB: 64 } });
    const sb = await Sandbox.create({ ...conn(b), resources: { memoryMiB: 64 } });
    const la = await setNetwork(asServer(a), sa.id, { mode: 'open' });
    const lb = await setNetwork(asServer(b), sb.id, { mode: 'open' });
    const octet = (addr: string | undefined): string => addr?.split('.')[2] ?? assert.fail('no link address');
    assert.notEqual(octet(la.address), octet(lb.address), `both edges use one block: ${JSON.stringify([la, lb])}`);
    const claims = execFileSync('grep', ['-l', `"owner":"${b.edgeId}"`, '-r', `${CLAIMS_DIR}/link-blocks`], { encoding: 'utf8' }).trim();
    assert.ok(claims, `edge ${b.edgeId} holds no block claim`);
    await sb.kill();
    const left = execFileSync('sh', ['-c', `grep -l '"owner":"${b.edgeId}"' -r ${CLAIMS_DIR}/link-blocks || true`], {
      encoding: 'utf8',
    }).trim();
    assert.equal(left, '', 'the block was not given back with its last link');
    await sa.kill();
  });
});
