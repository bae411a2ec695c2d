/**
 * A create in flight on a control-plane replica that dies is taken over by another replica once
 * its create lease runs out (control/create-leases.ts): two replicas on one real PostgreSQL, two
 * simulated edges (the edge protocol over HTTP, no crun) that take 2.5 s per create, and replica A
 * SIGKILLed while it waits on both edges. The sandbox its edge finished becomes running; the one
 * its edge refused (nobody was left to hear the refusal) becomes failed with the reason. Without
 * the takeover both would stay `creating` for ever. Replica A runs in a child process (so it can
 * die for real); replica B runs in this process. About 20 s, most of it the 10 s lease.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/bench/simulated-edge.js';
import { compileOptions } from '../../src/config/options.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startControlPlane, type RunningControl } from '../../src/runtime/all-in-one.js';
import { postgresSkipReason, testPostgres } from '../helpers/postgres.js';
import { integrationSkipReason, makeDataDir, mountsBelow } from '../helpers/server.js';

const skip = integrationSkipReason() ?? postgresSkipReason();
const replicaScript = join(fileURLToPath(new URL('.', import.meta.url)), 'support', 'replica-process.js');

interface Endpoint {
  url: string;
  apiKey: string;
}

async function api(at: Endpoint, method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${at.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${at.apiKey}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as unknown) : undefined };
}

async function until<T>(check: () => Promise<T | undefined>): Promise<T> {
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function listed(at: Endpoint, label: string): Promise<SandboxInfo[]> {
  return ((await api(at, 'GET', `/v1/sandboxes?label=case=${label}`)).body as { sandboxes: SandboxInfo[] }).sandboxes;
}

describe('a create in flight on a replica that dies', { skip, timeout: 120_000 }, () => {
  const dataDirs: string[] = [];
  let child: ChildProcess | undefined;
  let a: Endpoint & { joinToken: string };
  let b: RunningControl;
  let keeper: RunningSimulatedEdge;
  let dropper: RunningSimulatedEdge;

  before(async () => {
    const store = await (await testPostgres()).database(`dsec_takeover_${randomBytes(4).toString('hex')}`);
    dataDirs.push(makeDataDir(), makeDataDir());
    child = spawn(process.execPath, [replicaScript, JSON.stringify({ dataDir: dataDirs[0], store })], { stdio: ['ignore', 'pipe', 'inherit'] });
    const first = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child!.stdout! }).once('line', resolve);
      child!.once('exit', (code) => reject(new Error(`replica A exited (${code}) before it served`)));
    });
    a = JSON.parse(first) as Endpoint & { joinToken: string };
    b = await startControlPlane(compileOptions({ dataDir: dataDirs[1], store, listen: '127.0.0.1:0', logLevel: 'silent' }, {}));
    await buildBusyboxImage(b.images);
    const join = `${a.url},${b.url}`;
    keeper = await startSimulatedEdge({ join, token: a.joinToken, id: 'keeper', labels: { node: 'keeper' } });
    dropper = await startSimulatedEdge({ join, token: a.joinToken, id: 'dropper', labels: { node: 'dropper' } });
    await until(async () => {
      const n = ((await api(a, 'GET', '/v1/nodes')).body as { nodes: { state: string }[] }).nodes;
      return n.length === 2 && n.every((x) => x.state === 'ready') ? n : undefined;
    });
  });

  after(async () => {
    await keeper?.close();
    await dropper?.close();
    await b?.close();
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await new Promise((r) => child!.once('exit', r));
    }
    for (const d of dataDirs) {
      assert.deepEqual(mountsBelow(d), []);
      rmSync(d, { recursive: true, force: true });
    }
  });

  test('is finished by another replica when its edge made the sandbox, and failed with the reason when it did not', async () => {
    keeper.edge.createDelayMs = 2500;
    dropper.edge.createDelayMs = 2500;
    const pinned = (node: string): unknown => ({ image: 'busybox', labels: { case: `takeover-${node}` }, placement: { labels: { node } } });
    const answers = ['keeper', 'dropper'].map((node) => api(a, 'POST', '/v1/sandboxes', pinned(node)).then(() => 'answered', () => 'no answer'));
    // Both rows are written (creating) and both edges are working on them when A dies.
    const [kept, dropped] = await until(async () => {
      const k = (await listed(b, 'takeover-keeper'))[0];
      const d = (await listed(b, 'takeover-dropper'))[0];
      return k && d ? [k, d] : undefined;
    });
    assert.equal(kept.edge, 'keeper');
    assert.equal(dropped.edge, 'dropper');
    // The dropper's create fails when its delay ends; A, which would have recorded that, is dead by then.
    dropper.edge.stop();
    child!.kill('SIGKILL');
    await new Promise((r) => child!.once('exit', r));
    assert.deepEqual(await Promise.all(answers), ['no answer', 'no answer'], "A's callers never got an answer");
    for (const s of [kept, dropped]) assert.equal(((await api(b, 'GET', `/v1/sandboxes/${s.id}`)).body as SandboxInfo).status, 'creating', `${s.id} was creating when A died`);

    // B, once A's create leases run out, settles both from what their edges hold.
    const settled = await until(async () => {
      const k = (await api(b, 'GET', `/v1/sandboxes/${kept.id}`)).body as SandboxInfo;
      const d = (await api(b, 'GET', `/v1/sandboxes/${dropped.id}`)).body as SandboxInfo;
      return k.status !== 'creating' && d.status !== 'creating' ? { k, d } : undefined;
    });
    assert.equal(settled.k.status, 'running', 'the edge made it: running');
    assert.ok((await keeper.edge.listSandboxes()).some((s) => s.id === kept.id), 'and the keeper edge runs it');
    assert.equal(settled.d.status, 'failed', `the edge refused it: failed (${settled.d.reason})`);
    assert.match(settled.d.reason ?? '', /replica .* stopped .* while creating it, and its edge dropper did not have it/);
    assert.ok(!(await dropper.edge.listSandboxes()).some((s) => s.id === dropped.id), 'the dropper edge holds nothing of it');
    // The one that runs is an ordinary sandbox: B kills it, on its edge.
    assert.equal((await api(b, 'DELETE', `/v1/sandboxes/${kept.id}`)).status, 204);
    assert.ok(!(await keeper.edge.listSandboxes()).some((s) => s.id === kept.id));
  });

  test("a live replica's creates are not taken over: B's own create on a slow edge ends running", async () => {
    keeper.edge.createDelayMs = 2500;
    const made = (await api(b, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { case: 'own' }, placement: { labels: { node: 'keeper' } } })).body as SandboxInfo;
    assert.equal(made.status, 'running');
    assert.equal(((await api(b, 'GET', `/v1/sandboxes/${made.id}`)).body as SandboxInfo).status, 'running');
    assert.equal(keeper.edge.kills.get(made.id) ?? 0, 0, 'never killed by a takeover');
    keeper.edge.createDelayMs = 0;
    assert.equal((await api(b, 'DELETE', `/v1/sandboxes/${made.id}`)).status, 204);
  });
});
