/**
 * A create in flight on a control-plane replica that dies is taken over by another replica once
 * its create lease runs out (control/create-leases.ts): two replicas on one real PostgreSQL
 * (test/cluster/support/replica-pair.ts: replica A in a child process, so it can die for real;
 * replica B in this process), and replica A SIGKILLed while creates are in flight.
 * - With two simulated edges (the edge protocol over HTTP, no crun) that take 2.5 s per create:
 *   the sandbox its edge finished becomes running; the one its edge refused (nobody was left to
 *   hear the refusal) becomes failed with the reason. Without the takeover both would stay
 *   `creating` for ever. About 20 s, most of it the 10 s lease.
 * - With a real crun edge (and the cluster's registry as the blob store, so B reads every layer
 *   without A): a burst of creates at A, held at the edge until A is killed once B sees some of
 *   them `creating`; each one ends running (and answers an exec) or failed with the reason, the
 *   edge holds exactly the running ones, and once they are killed nothing of any is left on the
 *   edge. About 20 s.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import type { RunningEdgeDaemon } from '../../src/runtime/edge-daemon.js';
import { postgresSkipReason } from '../helpers/postgres.js';
import { registrySkipReason, startTestRegistry, type TestRegistry } from '../helpers/registry.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId } from '../helpers/server.js';
import { api, startJoinedEdge, startReplicaPair, until, type Endpoint, type ReplicaPair } from './support/replica-pair.js';

const skip = integrationSkipReason() ?? postgresSkipReason();

async function listed(at: Endpoint, label: string): Promise<SandboxInfo[]> {
  return ((await api(at, 'GET', `/v1/sandboxes?label=case=${label}`)).body as { sandboxes: SandboxInfo[] }).sandboxes;
}

describe('a create in flight on a replica that dies', { skip, timeout: 120_000 }, () => {
  let pair: ReplicaPair;
  let a: Endpoint & { joinToken: string };
  let b: ReplicaPair['b'];
  let keeper: RunningSimulatedEdge;
  let dropper: RunningSimulatedEdge;

  before(async () => {
    pair = await startReplicaPair({ name: 'dsec_takeover' });
    ({ a, b } = pair);
    keeper = await startSimulatedEdge({ join: pair.join, token: a.joinToken, id: 'keeper', labels: { node: 'keeper' } });
    dropper = await startSimulatedEdge({ join: pair.join, token: a.joinToken, id: 'dropper', labels: { node: 'dropper' } });
    await until(async () => {
      const n = ((await api(a, 'GET', '/v1/nodes')).body as { nodes: { state: string }[] }).nodes;
      return n.length === 2 && n.every((x) => x.state === 'ready') ? n : undefined;
    });
  });

  after(async () => {
    await keeper?.close();
    await dropper?.close();
    await pair?.close();
  });

  test('is finished by another replica when its edge made the sandbox, and failed with the reason when it did not', async () => {
    keeper.edge.createDelayMs = 2500;
    dropper.edge.createDelayMs = 2500;
    const pinned = (node: string): unknown => ({ image: 'busybox', labels: { case: `takeover-${node}` }, placement: { labels: { node } } });
    const answers = ['keeper', 'dropper'].map((node) =>
      api(a, 'POST', '/v1/sandboxes', pinned(node)).then(
        () => 'answered',
        () => 'no answer',
      ),
    );
    // Both rows are written (creating) and both edges are working on them when A dies.
    const [kept, dropped] = await until(async () => {
      const k = (await listed(b, 'takeover-keeper'))[0];
      const d = (await listed(b, 'takeover-dropper'))[0];
      return k && d ? [k, d] : undefined;
    });
    assert.equal(kept.edge, 'keeper');
    assert.equal(dropped.edge, 'dropper');
    // A writes a row before it asks the edge: killed between the two, the keeper would never have
    // made its sandbox (and B would rightly fail it). Both edges must have the creates in hand.
    const reached = (e: RunningSimulatedEdge): boolean => e.edge.making + e.edge.size > 0;
    await until(async () => (reached(keeper) && reached(dropper) ? true : undefined));
    // The dropper's create fails when its delay ends; A, which would have recorded that, is dead by then.
    dropper.edge.stop();
    await pair.killA();
    assert.deepEqual(await Promise.all(answers), ['no answer', 'no answer'], "A's callers never got an answer");
    for (const s of [kept, dropped])
      assert.equal(
        ((await api(b, 'GET', `/v1/sandboxes/${s.id}`)).body as SandboxInfo).status,
        'creating',
        `${s.id} was creating when A died`,
      );

    // B, once A's create leases run out, settles both from what their edges hold.
    const settled = await until(async () => {
      const k = (await api(b, 'GET', `/v1/sandboxes/${kept.id}`)).body as SandboxInfo;
      const d = (await api(b, 'GET', `/v1/sandboxes/${dropped.id}`)).body as SandboxInfo;
      return k.status !== 'creating' && d.status !== 'creating' ? { k, d } : undefined;
    });
    assert.equal(settled.k.status, 'running', 'the edge made it: running');
    assert.ok(
      (await keeper.edge.listSandboxes()).some((s) => s.id === kept.id),
      'and the keeper edge runs it',
    );
    assert.equal(settled.d.status, 'failed', `the edge refused it: failed (${settled.d.reason})`);
    assert.match(settled.d.reason ?? '', /replica .* stopped .* while creating it, and its edge dropper did not have it/);
    assert.ok(!(await dropper.edge.listSandboxes()).some((s) => s.id === dropped.id), 'the dropper edge holds nothing of it');
    // The one that runs is an ordinary sandbox: B kills it, on its edge.
    assert.equal((await api(b, 'DELETE', `/v1/sandboxes/${kept.id}`)).status, 204);
    assert.ok(!(await keeper.edge.listSandboxes()).some((s) => s.id === kept.id));
  });

  test("a live replica's creates are not taken over: B's own create on a slow edge ends running", async () => {
    keeper.edge.createDelayMs = 2500;
    const made = (
      await api(b, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { case: 'own' }, placement: { labels: { node: 'keeper' } } })
    ).body as SandboxInfo;
    assert.equal(made.status, 'running');
    assert.equal(((await api(b, 'GET', `/v1/sandboxes/${made.id}`)).body as SandboxInfo).status, 'running');
    assert.equal(keeper.edge.kills.get(made.id) ?? 0, 0, 'never killed by a takeover');
    keeper.edge.createDelayMs = 0;
    assert.equal((await api(b, 'DELETE', `/v1/sandboxes/${made.id}`)).status, 204);
  });
});

describe(
  'creates in flight on a replica that dies, with a real crun edge',
  { skip: skip ?? registrySkipReason(), timeout: 180_000 },
  () => {
    let registry: TestRegistry;
    let pair: ReplicaPair;
    let edge: RunningEdgeDaemon | undefined;
    const edgeDir = makeDataDir();
    const edgeId = newEdgeId();

    before(async () => {
      registry = await startTestRegistry();
      pair = await startReplicaPair({ name: 'dsec_takeover_crun', registry: `${registry.host}/team/takeover` });
      edge = await startJoinedEdge(pair, { dataDir: edgeDir, id: edgeId, maxSandboxes: 32 });
    });

    after(async () => {
      await edge?.close({ killAll: true });
      await pair?.close();
      await assertCleanAndRemove(edgeDir, edgeId);
      await registry?.close();
    });

    test('each ends running or failed with the reason; the edge holds exactly the running ones, and nothing once they are killed', async (t) => {
      const label = `crun-${randomBytes(3).toString('hex')}`;
      const burst = 12;
      // The edge's creates wait at a gate until A is dead, so their rows are `creating` and their
      // creates in flight at A when it dies, however fast this host is: without it, A settled all
      // twelve between B's look and the kill once an edge answers each create as it settles.
      let open!: () => void;
      const gate = new Promise<void>((res) => (open = res));
      const backend = edge!.edge;
      const create = backend.createSandbox.bind(backend);
      backend.createSandbox = async (req) => {
        await gate;
        return create(req);
      };
      t.after(() => {
        backend.createSandbox = create;
        open();
      });
      const answers = Array.from({ length: burst }, () =>
        api(pair.a, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { case: label } }).then(
          () => 'answered',
          () => 'no answer',
        ),
      );
      // A dies once some rows are written and not yet settled: their creates are in flight at A.
      await until(async () => ((await listed(pair.b, label)).filter((s) => s.status === 'creating').length >= 3 ? true : undefined));
      await pair.killA();
      open();
      await Promise.all(answers);
      const atDeath = await listed(pair.b, label);
      const inFlight = atDeath.filter((s) => s.status === 'creating').map((s) => s.id);
      assert.ok(inFlight.length >= 1, `some creates were in flight when A died: ${JSON.stringify(atDeath.map((s) => s.status))}`);

      // B, once A's create leases run out, settles every one from what the edge holds.
      const settled = await until(async () => {
        const now = await listed(pair.b, label);
        return now.every((s) => s.status !== 'creating') ? now : undefined;
      });
      assert.equal(settled.length, atDeath.length, 'every accepted create is accounted for');
      const onEdge = new Set((await edge!.edge.listSandboxes()).map((s) => s.id));
      const tookOver = settled.filter((s) => inFlight.includes(s.id));
      for (const s of settled) {
        assert.ok(s.status === 'running' || s.status === 'failed', `${s.id}: ${s.status}`);
        if (s.status === 'running') {
          assert.ok(onEdge.has(s.id), `${s.id} runs on the edge`);
          const ran = await api(pair.b, 'POST', `/v1/sandboxes/${s.id}/exec`, { cmd: ['echo', 'alive'] });
          assert.equal((ran.body as { stdout: string }).stdout, 'alive\n', `${s.id} answers through B`);
        } else {
          if (inFlight.includes(s.id))
            assert.match(s.reason ?? '', /replica .* stopped .* while creating it, and its edge .* did not have it/);
          else assert.ok(s.reason, `${s.id} failed with a reason`);
          assert.ok(!onEdge.has(s.id), `${s.id} (failed) is not on the edge`);
        }
      }
      assert.equal(
        [...onEdge].filter((id) => !settled.some((s) => s.id === id && s.status === 'running')).length,
        0,
        'the edge runs nothing the store does not call running',
      );
      t.diagnostic(
        `took over ${tookOver.length} creates: ${tookOver.filter((s) => s.status === 'running').length} running, ${tookOver.filter((s) => s.status === 'failed').length} failed`,
      );

      for (const s of settled.filter((x) => x.status === 'running'))
        assert.equal((await api(pair.b, 'DELETE', `/v1/sandboxes/${s.id}`)).status, 204);
      assert.deepEqual(await edge!.edge.listSandboxes(), [], 'nothing is left on the edge');
    });
  },
);
