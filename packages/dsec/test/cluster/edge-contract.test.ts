/**
 * The edge protocol's contract: the same tests against the in-process edge (as `dsec up` uses it)
 * and against HttpEdgeClient → `dsec edge`'s HTTP server → the same edge, so the control plane
 * cannot tell them apart. A real edge on crun, EROFS and overlayfs underneath both.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import { ApiError } from '../../src/api-error.js';
import { HttpEdgeClient } from '../../src/control/edges/http-edge-client.js';
import { LocalBlobSource } from '../../src/edge/node/blob-source.js';
import type { EdgeApi, EdgeCreateRequest } from '../../src/edge/protocol/edge-api.js';
import { Edge } from '../../src/edge/edge.js';
import { buildEdgeServer } from '../../src/edge/server/edge-server.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import type { App } from '../../src/control/server.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId } from '../helpers/server.js';

async function expectCode(p: Promise<unknown>, code: string): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof ApiError, `expected an ApiError, got ${String(err)}`);
    assert.equal(err.code, code, err.message);
    return true;
  });
}

async function collect(it: AsyncIterable<Buffer | Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of it) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

describe('edge protocol contract', { skip: integrationSkipReason(), timeout: 240_000 }, () => {
  const dataDir = makeDataDir();
  const edgeId = newEdgeId();
  const token = 'dsecjoin_contract-test-token';
  let edge: Edge;
  let server: App;
  let client: HttpEdgeClient;
  let layers: LayerStore;
  let spec: Omit<EdgeCreateRequest, 'id'>;
  let n = 0;

  before(async () => {
    layers = new LayerStore(dataDir);
    const images = new ImageStore(dataDir, layers);
    const built = await buildBusyboxImage(images);
    const m = images.get(built.id)!;
    spec = { layers: m.layers, config: m.config, env: {}, limits: { cpu: 0.5, memoryMiB: 64, pids: 64 } };
    edge = new Edge({
      id: edgeId,
      nodeDir: join(dataDir, 'node'),
      blobs: new LocalBlobSource(layers),
      maxSandboxes: 20,
      // CPU limits up to 4× the node's CPUs: 16 sandboxes of 0.5 CPU on this 2-CPU host, under the 20 slots.
      cpuOvercommit: 4,
      log: pino({ level: 'silent' }),
    });
    await edge.start();
    server = await buildEdgeServer(edge, { token, log: pino({ level: 'silent' }) });
    await server.listen({ host: '127.0.0.1', port: 0 });
    const addr = server.server.address() as { port: number };
    client = new HttpEdgeClient(edgeId, `http://127.0.0.1:${addr.port}`, token);
  });

  after(async () => {
    // The edge is shut down (its sandboxes killed) even when closing the server fails: a
    // sandbox left running here outlives the test process (crun containers are detached).
    try {
      await server?.close();
    } finally {
      await edge?.shutdown({ killAll: true });
      await assertCleanAndRemove(dataDir, edgeId);
    }
  });

  const newId = (): string => `sb-${edgeId}-contract${String(n++).padStart(4, '0')}`;

  for (const variant of ['in-process', 'http'] as const) {
    const api = (): EdgeApi => (variant === 'http' ? client : edge);

    describe(variant, () => {
      let id: string;

      test('info: protocol version, state and the node capacity measured on the edge', async () => {
        const info = await api().info();
        assert.equal(info.protocol, 1);
        assert.equal(info.id, edgeId);
        assert.equal(info.state, 'running');
        assert.ok(info.capacity.cpus >= 1 && info.capacity.memoryBytes > 0 && info.capacity.pidMax > 0);
      });

      test('create, list, exec with exit code, stdout and stderr', async () => {
        id = newId();
        const sb = await api().createSandbox({ ...spec, id });
        assert.equal(sb.id, id);
        assert.equal(sb.status, 'running');
        assert.ok((await api().listSandboxes()).some((s) => s.id === id));
        const r = await api().exec(id, { cmd: 'echo out; echo err >&2; exit 3' });
        assert.equal(r.exitCode, 3);
        assert.equal(r.stdout, 'out\n');
        assert.equal(r.stderr, 'err\n');
        const info = await api().info();
        assert.ok(info.capacity.memoryCommittedMiB >= 64, 'committed memory counts the sandbox');
      });

      test('exec stream: output as it comes, then the exit', async () => {
        const events = [];
        for await (const ev of api().execStream(id, { cmd: 'echo one; echo two >&2; exit 4' })) events.push(ev);
        const out = Buffer.concat(events.flatMap((e) => (e.type === 'stdout' ? [e.data] : []))).toString();
        const err = Buffer.concat(events.flatMap((e) => (e.type === 'stderr' ? [e.data] : []))).toString();
        assert.equal(out, 'one\n');
        assert.equal(err, 'two\n');
        const exit = events.at(-1);
        assert.ok(exit?.type === 'exit' && exit.result.exitCode === 4);
      });

      test('background process: stdin in, output out, wait for the exit', async () => {
        const p = await api().startProcess(id, { cmd: ['cat'], stdin: true });
        await api().writeProcessStdin(id, p.id, Buffer.from('piped bytes\n'), true);
        const done = await api().waitProcess(id, p.id, 10_000);
        assert.equal(done.status, 'exited');
        assert.equal(done.exitCode, 0);
        const out = await api().processOutput(id, p.id, { stdout: 0, stderr: 0 }, 'utf8');
        assert.equal(out.stdout, 'piped bytes\n');
        assert.ok((await api().listProcesses(id)).some((x) => x.id === p.id));
      });

      test('sessions keep cwd and variables between commands', async () => {
        const s = await api().openSession(id, {});
        await api().sessionExec(id, s.id, { cmd: 'cd /tmp && X=kept' });
        const r = await api().sessionExec(id, s.id, { cmd: 'echo $PWD $X' });
        assert.equal(r.stdout, '/tmp kept\n', JSON.stringify(r));
        assert.equal(r.sessionAlive, true);
        await api().closeSession(id, s.id);
        await expectCode(api().sessionExec(id, s.id, { cmd: 'true' }), 'SESSION_NOT_FOUND');
      });

      test('files: write, read, stat, list, mkdir, rename, remove', async () => {
        await api().makeDir(id, '/work/a/b', true);
        assert.equal(await api().writeFile(id, '/work/a/b/f.bin', Buffer.from([0, 255, 1, 254]), 0o640), 4);
        assert.deepEqual(await api().readFile(id, '/work/a/b/f.bin', 1024), Buffer.from([0, 255, 1, 254]));
        const st = await api().statPath(id, '/work/a/b/f.bin');
        assert.equal(st.type, 'file');
        assert.equal(st.size, 4);
        await api().renamePath(id, '/work/a/b/f.bin', '/work/a/g.bin');
        assert.deepEqual((await api().listDir(id, '/work/a')).entries.map((e) => e.name).sort(), ['b', 'g.bin']);
        await api().removePath(id, '/work/a', true);
        await expectCode(api().statPath(id, '/work/a'), 'FILE_NOT_FOUND');
      });

      test('tar: download a directory as a byte stream and upload it elsewhere', async () => {
        await api().writeFile(id, '/work/t/x.txt', Buffer.from('tarred\n'), 0o644);
        const tar = await collect(await api().downloadTar(id, '/work/t'));
        assert.ok(tar.length >= 1024);
        async function* once(): AsyncGenerator<Buffer> {
          yield tar;
        }
        assert.ok((await api().uploadTar(id, '/work/u', once())) > 0);
        const r = await api().exec(id, { cmd: 'cat /work/u/t/x.txt /work/u/x.txt 2>/dev/null' });
        assert.match(r.stdout, /tarred/);
      });

      test('terminal channel: keystrokes in, output out, resize, exit code', async () => {
        const t = await api().openPty(id, { cmd: ['/bin/sh'], cols: 80, rows: 24 });
        let text = '';
        t.onData((d) => (text += d.toString('utf8')));
        t.resize(100, 30);
        t.write('stty size; echo pty-$((40+2))\r');
        for (let i = 0; i < 200 && !/pty-42/.test(text); i++) await new Promise((r) => setTimeout(r, 25));
        assert.match(text, /pty-42/);
        assert.match(text, /30 100/);
        t.write('exit 5\r');
        assert.equal(await t.exit, 5);
      });

      test('port channel: a TCP connection into a sandbox under network none, bytes both ways, half-close passed on', async () => {
        // busybox nc runs cat on each accepted connection: an echo server on the sandbox's loopback.
        await api().startProcess(id, { cmd: ['nc', '-ll', '-p', '7000', '-e', 'cat'] });
        let conn: Duplex | undefined;
        for (let i = 0; i < 200 && !conn; i++) {
          conn = await api()
            .openPort(id, 7000)
            .catch((err: unknown) => {
              if (!(err instanceof ApiError && err.code === 'PORT_NOT_LISTENING')) throw err;
              return new Promise<undefined>((r) => setTimeout(() => r(undefined), 25));
            });
        }
        assert.ok(conn, 'the echo server came up');
        const payload = Buffer.concat([Buffer.from('hello through the edge\n'), Buffer.alloc(256 * 1024, 0xab), Buffer.from([0, 255, 1])]);
        const echoed = collect(conn);
        conn.end(payload); // our half-close: cat sees EOF, exits, and the server closes its side
        assert.deepEqual(await echoed, payload);
        await expectCode(api().openPort(id, 7001), 'PORT_NOT_LISTENING');
        await expectCode(api().openPort(`sb-${edgeId}-nosuchthing`, 7000), 'SANDBOX_NOT_FOUND');
      });

      test('volumes: created on the node, bind-mounted, sized, delete refused while mounted', async () => {
        const name = `contract-${variant}`;
        await api().createVolume(name);
        await expectCode(api().createVolume(name), 'VOLUME_EXISTS');
        const vid = newId();
        await api().createSandbox({ ...spec, id: vid, volumes: [{ name, path: '/vol', readOnly: false }] });
        assert.equal((await api().exec(vid, { cmd: 'printf 12345 > /vol/f && cat /vol/f' })).stdout, '12345');
        assert.equal((await api().volumeUsage(name)).bytes >= 5, true);
        await expectCode(api().deleteVolume(name), 'VOLUME_IN_USE');
        await expectCode(
          api().createSandbox({ ...spec, id: newId(), volumes: [{ name: 'contract-none', path: '/vol', readOnly: true }] }),
          'VOLUME_NOT_FOUND',
        );
        await api().killSandbox(vid);
        await api().deleteVolume(name);
        await expectCode(api().volumeUsage(name), 'VOLUME_NOT_FOUND');
      });

      test('pause, resume, network state, snapshot into the blob source', async () => {
        await api().pauseSandbox(id);
        assert.equal((await api().listSandboxes()).find((s) => s.id === id)?.status, 'paused');
        await api().resumeSandbox(id);
        assert.equal((await api().exec(id, { cmd: 'echo alive' })).stdout, 'alive\n');
        assert.equal((await api().getNetwork(id)).policy.mode, 'none');
        const usage = await api().sandboxUsage(id);
        assert.ok(usage.pids >= 1);
        await api().writeFile(id, '/work/snap.txt', Buffer.from('in the snapshot\n'), 0o644);
        const snap = await api().snapshotSandbox(id);
        assert.ok(snap.layer, 'a changed sandbox gives a layer');
        assert.ok(layers.has(snap.layer as `sha256:${string}`), 'the layer is in the blob store');
        assert.deepEqual(snap.baseLayers, spec.layers);
      });

      test('errors keep their registry codes across the seam', async () => {
        await expectCode(api().exec(`sb-${edgeId}-nosuchthing`, { cmd: 'true' }), 'SANDBOX_NOT_FOUND');
        await expectCode(api().createSandbox({ ...spec, id: newId(), layers: [`sha256:${'0'.repeat(64)}`] }), 'IMAGE_NOT_FOUND');
        await expectCode(api().createSandbox({ ...spec, id }), 'INVALID_REQUEST');
        await expectCode(api().setNetwork(id, { mode: 'allow', allow: ['1.2.3.4; flush ruleset'] }), 'INVALID_REQUEST');
      });

      test('a group create: each item succeeds or fails on its own, in order', async () => {
        const ok1 = newId();
        const ok2 = newId();
        const out = await api().createSandboxes([
          { ...spec, id: ok1 },
          { ...spec, id: newId(), layers: [`sha256:${'0'.repeat(64)}`] },
          { ...spec, id: ok2 },
        ]);
        assert.deepEqual(
          out.map((o) => o.id.length > 0),
          [true, true, true],
        );
        assert.equal(out[0]!.sandbox?.id, ok1);
        assert.equal(out[1]!.error?.code, 'IMAGE_NOT_FOUND');
        assert.equal(out[2]!.sandbox?.status, 'running');
        assert.equal((await api().exec(ok2, { cmd: 'echo grouped' })).stdout, 'grouped\n');
        await api().killSandbox(ok1);
        await api().killSandbox(ok2);
      });

      test('a group create heard as it goes: accepted, then each outcome once, as returned, the quick failure first', async () => {
        const ids = [newId(), newId(), newId()];
        const heard: number[] = [];
        const outcomes = new Map<number, unknown>();
        const out = await api().createSandboxes(
          [
            { ...spec, id: ids[0]! },
            { ...spec, id: ids[1]!, layers: [`sha256:${'0'.repeat(64)}`] },
            { ...spec, id: ids[2]! },
          ],
          {
            accepted: () => void heard.push(-1),
            outcome: (i, o) => {
              heard.push(i);
              outcomes.set(i, o);
            },
          },
        );
        assert.deepEqual([...heard].sort(), [-1, 0, 1, 2]);
        // Accepted first; then the item with no layer to fetch and no container to start settles
        // while the others start theirs.
        assert.deepEqual(heard.slice(0, 2), [-1, 1], `order heard: ${heard.join(',')}`);
        assert.deepEqual(
          out.map((_, i) => outcomes.get(i)),
          out,
        );
        assert.equal(out[1]!.error?.code, 'IMAGE_NOT_FOUND');
        await api().killSandbox(ids[0]!);
        await api().killSandbox(ids[2]!);
      });

      test('the node admits what fits its CPU cap (--cpu-overcommit) and refuses the rest with CAPACITY_EXCEEDED', async () => {
        const info = await api().info();
        const cap = info.capacity.cpus * 4;
        const fit = Math.floor((cap - info.capacity.cpuCommitted) / spec.limits.cpu + 1e-9);
        assert.ok(fit >= 1 && info.sandboxes + fit < info.maxSandboxes, `the CPU cap binds before the slots (${fit} fit)`);
        // All at once in one group: the node's budget is held before any create's first await.
        const out = await api().createSandboxes(Array.from({ length: fit + 2 }, () => ({ ...spec, id: newId() })));
        const made = out.filter((o) => o.sandbox).map((o) => o.id);
        assert.equal(made.length, fit, JSON.stringify(out.filter((o) => o.error).map((o) => o.error?.message)));
        for (const o of out.filter((x) => x.error)) {
          assert.equal(o.error!.code, 'CAPACITY_EXCEEDED');
          assert.match(o.error!.message, /CPUs committed .*--cpu-overcommit 4/);
        }
        assert.ok((await api().info()).capacity.cpuCommitted <= cap);
        for (const id of made) await api().killSandbox(id);
      });

      test('kill removes the sandbox; a second kill is SANDBOX_NOT_FOUND', async () => {
        await api().killSandbox(id);
        assert.ok(!(await api().listSandboxes()).some((s) => s.id === id));
        await expectCode(api().killSandbox(id), 'SANDBOX_NOT_FOUND');
      });
    });
  }

  test('http: a caller without the cluster token gets 401 on every route', async () => {
    const base = client.url;
    for (const [method, path] of [
      ['GET', '/edge/v1/info'],
      ['GET', '/edge/v1/sandboxes'],
      ['POST', '/edge/v1/sandboxes'],
      ['GET', '/edge/v1/nosuch'],
    ] as const) {
      const res = await fetch(`${base}${path}`, { method, headers: { authorization: 'Bearer wrong' } });
      assert.equal(res.status, 401, `${method} ${path}`);
      assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'UNAUTHORIZED');
    }
    const stranger = new HttpEdgeClient(edgeId, base, 'dsecjoin_not-the-token');
    await expectCode(stranger.info(), 'UNAUTHORIZED');
  });
});
