/**
 * Faults at the edge that used to lose or leak a sandbox, each against a real server and crun:
 * a `crun list` that fails at start (it must adopt and remove nothing), a teardown that fails on
 * kill (the sandbox must stay known and a second kill must finish it).
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';

const skip = integrationSkipReason();
const conn = (d: RunningDsec) => ({ url: d.url, apiKey: d.apiKey });

describe('edge start when crun list fails', { skip, timeout: 180_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let dsec: RunningDsec | undefined;
  let id = '';
  let startError: unknown;
  const bogus = () => join(dataDir, 'node', 'crun', 'sb-unreadable');

  before(async () => {
    dataDir = makeDataDir();
    dsec = await startDsec(dataDir, { edgeId });
    id = (await Sandbox.create({ ...conn(dsec) })).id;
    await dsec.close(); // the sandbox keeps running for the next start
    dsec = undefined;
    // A state file crun cannot parse (as a crash in the middle of crun's own write leaves): `crun list` exits 1.
    mkdirSync(bogus());
    writeFileSync(join(bogus(), 'status'), 'not json');
    try {
      dsec = await startDsec(dataDir, { edgeId });
    } catch (err) {
      startError = err;
    }
  });
  after(async () => {
    rmSync(bogus(), { recursive: true, force: true });
    dsec ??= await startDsec(dataDir, { edgeId });
    await dsec.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('the start fails with crun’s own error and says nothing was touched', () => {
    assert.ok(startError instanceof Error, 'the edge started although crun could not list its containers');
    assert.match(startError.message, /crun cannot list its containers/);
    assert.match(startError.message, /cannot parse status file/);
    assert.match(startError.message, /no sandbox was adopted or removed/);
  });

  test('the live sandbox is untouched: its container runs and its directory is there', () => {
    const state = spawnSync('crun', ['--root', join(dataDir, 'node', 'crun'), 'state', id], { encoding: 'utf8' });
    assert.equal(state.status, 0, state.stderr);
    assert.equal((JSON.parse(state.stdout) as { status: string }).status, 'running');
    assert.ok(existsSync(join(dataDir, 'node', 'sandboxes', id, 'state.json')));
  });

  test('once crun can list again, the next start adopts it', async () => {
    rmSync(bogus(), { recursive: true, force: true });
    dsec = await startDsec(dataDir, { edgeId });
    const sb = await Sandbox.connect(id, conn(dsec));
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
  });
});

describe('a kill whose teardown fails', { skip, timeout: 180_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let dsec: RunningDsec | undefined;
  let id = '';
  let stuck = '';
  let immutable = '';

  before(async () => {
    dataDir = makeDataDir();
    dsec = await startDsec(dataDir, { edgeId });
    const sb = await Sandbox.create({ ...conn(dsec) });
    id = sb.id;
    await sb.files.write('/stuck.txt', 'cannot be deleted');
    // An immutable file in the writable layer: the sandbox directory cannot be removed (a real
    // EPERM from the kernel, as a busy or broken filesystem gives).
    stuck = join(dsec.edge.records.paths(id).upper, 'stuck.txt');
    const r = spawnSync('chattr', ['+i', stuck], { encoding: 'utf8' });
    if (r.status !== 0) immutable = `chattr +i does not work on this data dir's filesystem: ${r.stderr.trim()}`;
  });
  after(async () => {
    if (stuck && existsSync(stuck)) spawnSync('chattr', ['-i', stuck]);
    await dsec?.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('the kill answers SANDBOX_KILL_FAILED naming the cause', async (t) => {
    if (immutable) return t.skip(immutable);
    const res = await call(conn(dsec!), 'DELETE', `/v1/sandboxes/${id}`);
    const e = expectWireError(res, 500, 'SANDBOX_KILL_FAILED');
    assert.match(e.message, /kill it again/);
  });

  test('the sandbox stays known on the edge and in the store, failed with the reason', async (t) => {
    if (immutable) return t.skip(immutable);
    assert.ok(
      (await dsec!.edge.listSandboxes()).some((s) => s.id === id),
      'the edge forgot a sandbox whose resources remain',
    );
    const res = await call(conn(dsec!), 'GET', `/v1/sandboxes/${id}`);
    assert.equal(res.status, 200, res.text);
    const info = res.json as { status: string; reason?: string };
    assert.equal(info.status, 'failed');
    assert.match(info.reason ?? '', /^kill failed, resources remain/);
    // No new work lands on a sandbox that is being torn down.
    const exec = await call(conn(dsec!), 'POST', `/v1/sandboxes/${id}/exec`, { json: { cmd: ['true'] } });
    assert.equal(exec.status, 409, exec.text);
  });

  test('once the cause is gone, a second kill removes everything and the row', async (t) => {
    if (immutable) return t.skip(immutable);
    execFileSync('chattr', ['-i', stuck]);
    const res = await call(conn(dsec!), 'DELETE', `/v1/sandboxes/${id}`);
    assert.ok(res.status < 300, res.text);
    assert.equal((await call(conn(dsec!), 'GET', `/v1/sandboxes/${id}`)).status, 404);
    assert.equal(existsSync(join(dataDir, 'node', 'sandboxes', id)), false);
    assert.equal((await dsec!.edge.listSandboxes()).length, 0);
  });
});
