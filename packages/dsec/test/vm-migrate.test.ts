/**
 * A microVM moved between two edges for real (the edge side of issue 33): its state saved as one
 * blob in the cluster's blob store (`snapshotSandbox` with `memory` and `portable`), then started
 * on another edge from that blob (`restoreState`) under the same id, both over the HTTP edge
 * protocol. Edge A is `dsec up`'s own (its blobs in the control plane's layer store); edge B is a
 * second edge in this process whose blobs come over the control plane's `/v1/blobs`, as a
 * remote node's do. QEMU under TCG here: one boot for the whole file.
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import { ApiError } from '../src/api-error.js';
import { HttpEdgeClient } from '../src/control/edges/http-edge-client.js';
import type { App } from '../src/control/server.js';
import { Edge } from '../src/edge/edge.js';
import { HttpBlobSource } from '../src/edge/node/blob-source.js';
import type { EdgeApi, EdgeCreateRequest } from '../src/edge/protocol/edge-api.js';
import { buildEdgeServer } from '../src/edge/server/edge-server.js';
import { findLeaks } from '../src/host/leak-check.js';
import type { LayerDigest } from '../src/image/layer-store.js';
import { assertCleanAndRemove, makeDataDir, newEdgeId, startTestServer, type TestServer } from './helpers/server.js';
import { vmSkipReason } from './helpers/vm.js';

const skip = vmSkipReason();

async function expectCode(p: Promise<unknown>, code: string, message?: RegExp): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof ApiError, `expected an ApiError, got ${String(err)}`);
    assert.equal(err.code, code, err.message);
    if (message) assert.match(err.message, message);
    return true;
  });
}

/** An edge served over HTTP on loopback, and the client the control plane would use for it. */
async function serve(edge: Edge, token: string): Promise<{ app: App; client: HttpEdgeClient }> {
  const app = await buildEdgeServer(edge, { token, log: pino({ level: 'silent' }) });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as { port: number };
  return { app, client: new HttpEdgeClient(edge.id, `http://127.0.0.1:${port}`, token) };
}

describe('a running microVM moves between edges with its memory, processes and disk', { skip, timeout: 900_000 }, () => {
  let server: TestServer;
  const dirB = makeDataDir();
  const edgeIdB = newEdgeId();
  let edgeB: Edge;
  let joinToken: string;
  let servedA: { app: App; client: HttpEdgeClient };
  let servedB: { app: App; client: HttpEdgeClient };
  let spec: Omit<EdgeCreateRequest, 'id'>;
  let id: string;
  const blobs: LayerDigest[] = [];

  before(async () => {
    server = await startTestServer();
    joinToken = (JSON.parse(readFileSync(join(server.dataDir, 'client.json'), 'utf8')) as { joinToken: string }).joinToken;
    await startB();
    servedA = await serve(server.dsec.node, joinToken);
    const image = server.dsec.images.get(server.dsec.images.resolve('busybox')!)!;
    spec = {
      layers: image.layers,
      config: image.config,
      env: {},
      limits: { cpu: 1, memoryMiB: 256, pids: 64, diskMiB: 64 },
      backend: 'microvm',
    };
    id = `sb-${server.edgeId}-moved${Date.now().toString(36)}`;
  });

  after(async () => {
    try {
      await servedA?.app.close();
      await servedB?.app.close();
    } finally {
      await edgeB?.shutdown({ killAll: true });
      await assertCleanAndRemove(dirB, edgeIdB);
      await server?.close();
    }
  });

  /** Edge B (again, after a restart: it adopts the VMs its previous process left running), served. */
  async function startB(): Promise<void> {
    edgeB = new Edge({
      id: edgeIdB,
      nodeDir: join(dirB, 'node'),
      blobs: new HttpBlobSource(server.url, joinToken),
      maxSandboxes: 8,
      log: pino({ level: 'silent' }),
    });
    await edgeB.start();
    servedB = await serve(edgeB, joinToken);
  }

  /** Saves the VM on `from`, kills it there, starts it on `to` from the blob: the move as the control plane makes it. */
  async function move(from: EdgeApi, to: EdgeApi): Promise<{ saveMs: number; restoreMs: number; bytes: number; digest: LayerDigest }> {
    const t0 = performance.now();
    const snap = await from.snapshotSandbox(id, { memory: true, portable: true });
    const saveMs = performance.now() - t0;
    assert.ok(snap.state, 'a portable save names its blob');
    assert.match(snap.state.digest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(snap.layer, null);
    assert.deepEqual(snap.baseLayers, spec.layers);
    const digest = snap.state.digest as LayerDigest;
    blobs.push(digest);
    assert.equal(server.dsec.images.layers.size(digest), snap.state.bytes, "the blob is in the cluster's blob store, whole");
    // Stopped after the save, so nothing it does afterwards is lost; calls say so.
    assert.equal((await from.listSandboxes()).find((s) => s.id === id)?.status, 'paused');
    await expectCode(from.exec(id, { cmd: 'true' }), 'SANDBOX_NOT_RUNNING');
    await expectCode(
      to.createSandbox({ ...spec, id: `${id}x`, layers: [...spec.layers, ...spec.layers], restoreState: digest }),
      'INVALID_REQUEST',
      /other layers/,
    );
    // Its QEMU still runs on this host under the same id: a restore here would share its cgroup.
    await expectCode(to.createSandbox({ ...spec, id, restoreState: digest }), 'INVALID_REQUEST', /still runs on this host/);
    await from.killSandbox(id);
    const t1 = performance.now();
    const made = await to.createSandbox({ ...spec, id, restoreState: digest });
    const restoreMs = performance.now() - t1;
    assert.equal(made.id, id);
    assert.equal(made.status, 'running');
    return { saveMs, restoreMs, bytes: snap.state.bytes, digest };
  }

  /**
   * What an edge's data dir still holds of the VM (its directory, its QEMU). Its cgroup is left
   * out: cgroups are the host's, and `dsec/<id>` is the VM's new edge's now (both edges are on this host).
   */
  async function leftIn(dataDir: string): Promise<string[]> {
    return (await findLeaks(dataDir, { onlyIds: [id] })).filter((l) => !l.startsWith('cgroup '));
  }

  /** What must hold after every move: the file on disk, the tmpfs file, the same process, still counting. */
  async function probe(api: EdgeApi, pid: string, countBefore: number, shmSum: string): Promise<void> {
    const r = await api.exec(id, {
      cmd: `cat /work/on-disk; echo; cat /dev/shm/in-memory; kill -0 ${pid} && echo alive; a=$(cat /dev/shm/count); sleep 1; b=$(cat /dev/shm/count); [ "$b" -gt "$a" ] && echo counting; echo "$a"; md5sum /dev/shm/noise | cut -d' ' -f1`,
      timeoutMs: 60_000,
    });
    const lines = r.stdout.trim().split('\n');
    assert.deepEqual(lines.slice(0, 4), ['disk state', 'ram-only', 'alive', 'counting'], `${r.stdout} ${r.stderr}`);
    assert.ok(Number(lines[4]) >= countBefore, `the counter went on from ${countBefore}, not from 0: ${lines[4]}`);
    assert.equal(lines[5], shmSum, "the guest's memory (a tmpfs of random bytes) came over intact");
  }

  test('A → B → A: saved as one blob, restored under the same id; the process lives on (same pid, still counting), files on disk and in tmpfs are there; a save B restarts after is adopted paused and resumes; no blob or file is left', async (t) => {
    const a = servedA.client;
    const b = servedB.client;
    await a.createSandbox({ ...spec, id });
    const setup = await a.exec(id, {
      cmd: 'mkdir -p /work && echo -n "disk state" > /work/on-disk && echo ram-only > /dev/shm/in-memory && head -c 16m /dev/urandom > /dev/shm/noise && md5sum /dev/shm/noise | cut -d" " -f1',
      timeoutMs: 120_000,
    });
    assert.equal(setup.exitCode, 0, setup.stderr);
    const shmSum = setup.stdout.trim();
    await a.startProcess(id, {
      cmd: [
        'sh',
        '-c',
        'echo $$ > /dev/shm/bg.pid; n=0; while :; do n=$((n+1)); echo $n > /dev/shm/count.new; mv /dev/shm/count.new /dev/shm/count; sleep 0.2; done',
      ],
    });
    const started = await a.exec(id, {
      cmd: 'for i in $(seq 100); do [ -s /dev/shm/count ] && break; sleep 0.1; done; cat /dev/shm/bg.pid /dev/shm/count',
    });
    const [pid, count] = started.stdout.trim().split('\n');
    assert.match(pid ?? '', /^\d+$/, started.stdout + started.stderr);

    await expectCode(a.snapshotSandbox(id, { portable: true }), 'INVALID_REQUEST', /portable/);
    const there = await move(a, b);
    t.diagnostic(
      `A→B (256 MiB guest, 16 MiB in tmpfs): save ${there.saveMs.toFixed(0)} ms, restore ${there.restoreMs.toFixed(0)} ms, blob ${(there.bytes / 2 ** 20).toFixed(1)} MiB`,
    );
    assert.deepEqual(await leftIn(server.dataDir), [], 'nothing of the VM is left on A');
    await probe(b, pid!, Number(count), shmSum);
    assert.equal(existsSync(join(dirB, 'node', 'vms', id, 'incoming')), false, 'the fetched state is removed once loaded');

    // A move that does not happen: saved (the blob goes up through the control plane's
    // PUT /v1/blobs, B's blob source), B's process restarts meanwhile, and the VM, stopped, is
    // adopted as paused and resumed where it was.
    const tKept = performance.now();
    const kept = await b.snapshotSandbox(id, { memory: true, portable: true });
    t.diagnostic(
      `save on B through PUT /v1/blobs (16 MiB in tmpfs): ${(performance.now() - tKept).toFixed(0)} ms, blob ${(kept.state!.bytes / 2 ** 20).toFixed(1)} MiB`,
    );
    blobs.push(kept.state!.digest as LayerDigest);
    await servedB.app.close();
    await edgeB.shutdown();
    await startB();
    assert.equal((await servedB.client.listSandboxes()).find((s) => s.id === id)?.status, 'paused', 'adopted stopped, as paused');
    // A save retried on a VM stopped by one (the first answer lost) saves it again.
    const again = await servedB.client.snapshotSandbox(id, { memory: true, portable: true });
    blobs.push(again.state!.digest as LayerDigest);
    await servedB.client.resumeSandbox(id);
    await probe(servedB.client, pid!, Number(count), shmSum);
    // A move whose source edge restarts while it holds the VM (quiesced, the control plane's move
    // failing with it): the VM runs on there, as its control plane has it, not adopted paused.
    assert.equal((await servedB.client.quiesceSandbox(id, { endProcesses: false })).frozen, true);
    await servedB.app.close();
    await edgeB.shutdown();
    await startB();
    assert.equal((await servedB.client.listSandboxes()).find((s) => s.id === id)?.status, 'running', "a move's hold is not a pause");
    await probe(servedB.client, pid!, Number(count), shmSum);

    // Back again, with more of its memory written: A restores from its own store, as a failed
    // move's way back would.
    const more = await servedB.client.exec(id, {
      cmd: 'head -c 48m /dev/urandom > /dev/shm/more && cat /dev/shm/count',
      timeoutMs: 120_000,
    });
    assert.equal(more.exitCode, 0, more.stderr);
    const back = await move(servedB.client, a);
    t.diagnostic(
      `B→A (256 MiB guest, 64 MiB in tmpfs): save ${back.saveMs.toFixed(0)} ms, restore ${back.restoreMs.toFixed(0)} ms, blob ${(back.bytes / 2 ** 20).toFixed(1)} MiB`,
    );
    assert.deepEqual(await leftIn(dirB), [], 'nothing of the VM is left on B');
    await probe(a, pid!, Number(more.stdout.trim()), shmSum);

    // Staging went with each save; the blobs are the control plane's to delete once the move is
    // recorded (its GC would take them as unreferenced): deleted here as it would.
    for (const dir of [server.dataDir, dirB]) {
      const tmp = join(dir, 'node', 'tmp');
      assert.deepEqual(existsSync(tmp) ? readdirSync(tmp).filter((f) => f.startsWith('vm-state-')) : [], [], `no staging left in ${tmp}`);
    }
    for (const d of blobs) {
      assert.ok(server.dsec.images.layers.size(d) > 0);
      server.dsec.images.layers.remove(d);
      assert.equal(server.dsec.images.layers.has(d), false);
    }
    await a.killSandbox(id);
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [id] }), []);
  });

  test('refusals make nothing: an unknown blob, a blob that is no VM state, a container, both restores', async () => {
    const b = servedB.client;
    const other = `sb-${server.edgeId}-refused${Date.now().toString(36)}`;
    const missing = `sha256:${'0'.repeat(64)}`;
    await expectCode(b.createSandbox({ ...spec, id: other, restoreState: missing }), 'BLOB_NOT_FOUND');
    await expectCode(b.createSandbox({ ...spec, id: other, restoreState: spec.layers[0]! }), 'INVALID_REQUEST', /not a VM state blob/);
    await expectCode(
      b.createSandbox({ ...spec, id: other, backend: 'container', restoreState: missing }),
      'INVALID_REQUEST',
      /restoreState/,
    );
    await expectCode(
      b.createSandbox({ ...spec, id: other, restoreState: missing, restoreFrom: other }),
      'INVALID_REQUEST',
      /restoreFrom and restoreState/,
    );
    assert.equal((await b.listSandboxes()).filter((s) => s.id === other).length, 0);
    assert.equal(existsSync(join(dirB, 'node', 'vms', other)), false);
  });
});
