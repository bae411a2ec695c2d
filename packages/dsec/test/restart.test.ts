/**
 * Restarts on one data dir: a server closed without killing hands its sandboxes to the next start,
 * and whatever changed behind its back while it was down is reconciled without leaks.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { StateStore } from '../src/control/state-store.js';
import { testStoreLocation } from './helpers/postgres.js';
import { findLeaks } from '../src/host/leak-check.js';
import type { RunningDsec } from '../src/runtime/all-in-one.js';
import { assertCleanAndRemove, dataDirLeaks, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';

const skip = integrationSkipReason();

/** Two starts on one data dir; `after` kills everything and checks the data dir is clean. */
function restartFixture() {
  const f = {
    dataDir: '',
    edgeId: newEdgeId(),
    first: undefined as RunningDsec | undefined,
    second: undefined as RunningDsec | undefined,
    /** Starts dsec on the fixture's data dir with the fixture's edge id. */
    start(): Promise<RunningDsec> {
      return startDsec(this.dataDir, { edgeId: this.edgeId });
    },
  };
  const cleanup = async (): Promise<void> => {
    await f.first?.close({ killAll: true }); // no-op when already closed
    await f.second?.close({ killAll: true });
    if (f.dataDir) await assertCleanAndRemove(f.dataDir, f.edgeId);
  };
  return { f, cleanup };
}

const conn = (d: RunningDsec) => ({ url: d.url, apiKey: d.apiKey });

describe('restart re-adopts running sandboxes', { skip, timeout: 120_000 }, () => {
  const { f, cleanup } = restartFixture();
  let id: string;
  let whileDown: string[];

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    const sb = await Sandbox.create({ ...conn(f.first), resources: { memoryMiB: 64 }, labels: { case: 'restart' } });
    id = sb.id;
    await sb.files.write('/work/kept.txt', 'written before the restart');
    const bg = await sb.commands.run('(sleep 1007 &) ; exit 0');
    assert.equal(bg.exitCode, 0, bg.stderr);
    await f.first.close(); // sandboxes keep running
    whileDown = await findLeaks(f.dataDir, { onlyIds: [id] });
    f.second = await f.start();
  });
  after(cleanup);

  test('closing the server without killAll leaves the sandbox running on the host', () => {
    assert.ok(
      whileDown.some((l) => l.startsWith('crun container')),
      `no crun container for ${id}: ${JSON.stringify(whileDown)}`,
    );
    assert.ok(
      whileDown.some((l) => l.startsWith('mount ')),
      `no overlay mount for ${id}: ${JSON.stringify(whileDown)}`,
    );
  });

  test('the second start reuses the API key from client.json', () => {
    assert.equal(f.second!.apiKey, f.first!.apiKey);
    assert.equal(f.second!.newKey, false);
  });

  test('the sandbox is listed as running', async () => {
    const list = await Sandbox.list({ ...conn(f.second!), labels: { case: 'restart' } });
    assert.deepEqual(
      list.map((s) => [s.id, s.status]),
      [[id, 'running']],
    );
  });

  test('the file written before the restart is still there', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    assert.equal(await sb.files.readText('/work/kept.txt'), 'written before the restart');
  });

  test('exec works in the adopted sandbox', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    const r = await sb.commands.run('cat /work/kept.txt; echo; echo $((6*7))');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, 'written before the restart\n42\n');
  });

  test('a process started before the restart is still running (same container, not recreated)', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    const r = await sb.commands.run(`ps -o args | grep -c '^sleep 1007$'`);
    assert.equal(r.stdout.trim(), '1');
  });

  test('files can be written after the restart', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    await sb.files.write('/work/after.txt', 'after');
    assert.equal((await sb.commands.run(['cat', '/work/after.txt'])).stdout, 'after');
  });

  test('killing the adopted sandbox removes everything it had', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    await sb.kill();
    assert.deepEqual(await findLeaks(f.dataDir, { onlyIds: [id] }), []);
    assert.deepEqual(await dataDirLeaks(f.dataDir, f.edgeId), [], 'the layer mount is released with the last sandbox');
  });
});

describe('restart with a paused sandbox', { skip, timeout: 120_000 }, () => {
  const { f, cleanup } = restartFixture();
  let id: string;

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    const sb = await Sandbox.create({ ...conn(f.first), resources: { memoryMiB: 64 }, labels: { case: 'restart-paused' } });
    id = sb.id;
    // State that lives only in memory: a file on the sandbox's /dev/shm tmpfs and a running process.
    const r = await sb.commands.run('echo in-memory > /dev/shm/kept && (sleep 1009 &) ; exit 0');
    assert.equal(r.exitCode, 0, r.stderr);
    await sb.pause();
    await f.first.close(); // sandboxes keep running (here: frozen)
    f.second = await f.start();
  });
  after(cleanup);

  test('it is adopted, still paused, not torn down as lost', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    assert.equal(sb.info.status, 'paused', JSON.stringify(sb.info));
  });

  test('resume brings back its memory and processes as they were', async () => {
    const sb = await Sandbox.connect(id, conn(f.second!));
    await sb.resume();
    const r = await sb.commands.run('cat /dev/shm/kept; ps -o args | grep -c "[s]leep 1009"');
    assert.equal(r.stdout, 'in-memory\n1\n', r.stderr);
  });
});

describe('restart after the container was removed behind dsec', { skip, timeout: 120_000 }, () => {
  const { f, cleanup } = restartFixture();
  let id: string;

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    const sb = await Sandbox.create({ ...conn(f.first), labels: { case: 'lost' } });
    id = sb.id;
    await sb.files.write('/tmp/x', 'x');
    await f.first.close();
    execFileSync('crun', ['--root', join(f.dataDir, 'node', 'crun'), 'delete', '-f', id], { stdio: 'pipe' });
    f.second = await f.start();
  });
  after(cleanup);

  test("the sandbox is listed as failed with a reason containing 'lost'", async () => {
    const list = await Sandbox.list({ ...conn(f.second!), labels: { case: 'lost' } });
    assert.equal(list.length, 1);
    assert.equal(list[0]!.id, id);
    assert.equal(list[0]!.status, 'failed');
    assert.match(list[0]!.reason ?? '', /lost/);
  });

  test('nothing of it is left on the host: overlay mount, cgroup, directory', async () => {
    assert.deepEqual(await findLeaks(f.dataDir, { onlyIds: [id] }), []);
  });

  test('the layer it held is unmounted (no sandbox uses it any more)', async () => {
    assert.deepEqual(await dataDirLeaks(f.dataDir, f.edgeId), []);
  });

  test('exec on it: 409 SANDBOX_NOT_RUNNING', async () => {
    expectWireError(await call(conn(f.second!), 'POST', `/v1/sandboxes/${id}/exec`, { json: { cmd: 'true' } }), 409, 'SANDBOX_NOT_RUNNING');
  });

  test('DELETE removes the lost sandbox record', async () => {
    assert.equal((await call(conn(f.second!), 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    expectWireError(await call(conn(f.second!), 'GET', `/v1/sandboxes/${id}`), 404, 'SANDBOX_NOT_FOUND');
  });

  test('new sandboxes work after the cleanup', async () => {
    const sb = await Sandbox.create(conn(f.second!));
    assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    await sb.kill();
  });
});

describe('restart when the state store forgot a sandbox the edge still runs', { skip, timeout: 120_000 }, () => {
  const { f, cleanup } = restartFixture();
  let id: string;

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    const sb = await Sandbox.create({ ...conn(f.first), labels: { case: 'orphan' } });
    id = sb.id;
    await f.first.close();
    const store = await StateStore.open(await testStoreLocation(join(f.dataDir, 'state.db')));
    try {
      await store.sandboxes.delete(id);
    } finally {
      await store.close();
    }
    f.second = await f.start();
  });
  after(cleanup);

  test('the orphaned sandbox is killed at start, leaving nothing on the host', async () => {
    assert.deepEqual(await findLeaks(f.dataDir, { onlyIds: [id] }), []);
  });

  test('the orphan is not listed', async () => {
    assert.deepEqual(await Sandbox.list({ ...conn(f.second!), labels: { case: 'orphan' } }), []);
  });
});

describe('restart after a crash left a half-made sandbox directory', { skip, timeout: 60_000 }, () => {
  const { f, cleanup } = restartFixture();
  const id = `sb-${f.edgeId}-halfmade000000`;

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    await f.first.close();
    // A crash between mkdir and the first state save: a directory without state.json.
    mkdirSync(join(f.dataDir, 'node', 'sandboxes', id, 'run'), { recursive: true });
    f.second = await f.start();
  });
  after(cleanup);

  test('the half-made directory is removed at start', async () => {
    assert.deepEqual(await findLeaks(f.dataDir, { onlyIds: [id] }), []);
  });
});

describe('restart after the sandbox init was killed on the host while dsec was down', { skip, timeout: 60_000 }, () => {
  const { f, cleanup } = restartFixture();
  let id: string;

  before(async () => {
    f.dataDir = makeDataDir();
    f.first = await f.start();
    const sb = await Sandbox.create({ ...conn(f.first), labels: { case: 'init-killed' } });
    id = sb.id;
    await f.first.close();
    const state = JSON.parse(execFileSync('crun', ['--root', join(f.dataDir, 'node', 'crun'), 'state', id], { encoding: 'utf8' })) as {
      pid: number;
    };
    process.kill(state.pid, 'SIGKILL');
    // Wait for the container to be seen as stopped (bounded by the suite timeout).
    while (
      JSON.parse(execFileSync('crun', ['--root', join(f.dataDir, 'node', 'crun'), 'state', id], { encoding: 'utf8' })).status !== 'stopped'
    ) {
      await new Promise((r) => setTimeout(r, 20));
    }
    f.second = await f.start();
  });
  after(cleanup);

  test("the sandbox is listed as failed with a reason containing 'lost'", async () => {
    const list = await Sandbox.list({ ...conn(f.second!), labels: { case: 'init-killed' } });
    assert.deepEqual(
      list.map((s) => [s.id, s.status]),
      [[id, 'failed']],
    );
    assert.match(list[0]!.reason ?? '', /lost/);
  });

  test('the stopped container and all it had are removed', async () => {
    assert.deepEqual(await findLeaks(f.dataDir, { onlyIds: [id] }), []);
  });
});
