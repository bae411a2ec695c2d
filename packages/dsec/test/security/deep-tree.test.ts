/**
 * Red team, one deep directory tree (issue 10, High 3): 2,100 nested directories made inside a
 * sandbox put its deepest path past PATH_MAX. The red team saw snapshot answer 500 ("Maximum
 * call stack size exceeded") and leak its staging dir, DELETE answer 500 (ENAMETOOLONG) and leak
 * the sandbox dir, and every later start crash in its clean-up. Here: snapshot refuses with a
 * 413 that names the path and leaves no staging dir; DELETE removes everything; an edge that
 * restarts beside a dead sandbox holding such a tree removes it; and an edge whose clean-up of one
 * dead sandbox fails (a file made immutable on the host) starts anyway and serves the rest.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';
import { must } from './support/harness.js';

/**
 * 2,200 nested `d` directories under /tmp/deep (4,400+ bytes of path): two trees of 1,100, the
 * second then moved to the bottom of the first (no single path given to mkdir may pass PATH_MAX).
 */
const DEEP =
  'p=d; i=1; while [ $i -lt 100 ]; do p=$p/d; i=$((i+1)); done; q=$p; j=1; while [ $j -lt 11 ]; do q=$q/$p; j=$((j+1)); done; ' +
  'mkdir -p /tmp/deep/$q /tmp/lower/$q && cd /tmp/deep/$q && mv /tmp/lower/d ./d 2>&1 && echo moved';

describe('red team: a directory tree deeper than PATH_MAX', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir: string;
  let dsec: RunningDsec | undefined;
  const conn = (): { url: string; apiKey: string } => ({ url: dsec!.url, apiKey: dsec!.apiKey });
  const server = (): { url: string; apiKey: string; conn: { url: string; apiKey: string } } => ({ ...conn(), conn: conn() });

  async function deepSandbox(): Promise<Sandbox> {
    const sb = await Sandbox.create({ ...conn(), resources: { memoryMiB: 64 } });
    const r = await must(server() as never, sb, DEEP);
    assert.equal(r.stdout, 'moved\n', r.stderr);
    return sb;
  }

  before(async () => {
    dataDir = makeDataDir();
    dsec = await startDsec(dataDir, { edgeId });
  });
  after(async () => {
    await dsec?.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('snapshot refuses with 413 naming the path, leaves no staging dir, and the sandbox keeps working', async () => {
    const sb = await deepSandbox();
    const res = await call(conn(), 'POST', `/v1/sandboxes/${sb.id}/snapshot`, { json: {} });
    const err = expectWireError(res, 413, 'PAYLOAD_TOO_LARGE');
    assert.match(err.message, /path too long to snapshot/, err.message);
    assert.deepEqual(
      readdirSync(join(dataDir, 'node', 'tmp')).filter((n) => n.startsWith('snap-')),
      [],
      'a snapshot staging dir was left behind',
    );
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
    await sb.kill();
  });

  test('DELETE removes a sandbox with such a tree, leaving nothing', async () => {
    const sb = await deepSandbox();
    const dir = join(dataDir, 'node', 'sandboxes', sb.id);
    const res = await call(conn(), 'DELETE', `/v1/sandboxes/${sb.id}`);
    assert.ok(res.status < 300, `${res.status} ${res.text}`);
    assert.equal(existsSync(dir), false, `${dir} was left behind`);
  });

  test('a restarted edge removes a dead sandbox holding such a tree, and starts even when cleaning another fails', async () => {
    const deep = await deepSandbox();
    const stuck = await Sandbox.create({ ...conn(), resources: { memoryMiB: 64 } });
    await must(server() as never, stuck, 'echo x > /tmp/immutable');
    const bystander = await Sandbox.create({ ...conn(), resources: { memoryMiB: 64 } });
    await dsec!.close(); // sandboxes keep running
    // Both die behind the edge's back; one holds a file the host made immutable, so rm fails on it.
    const crunRoot = join(dataDir, 'node', 'crun');
    for (const id of [deep.id, stuck.id]) execFileSync('crun', ['--root', crunRoot, 'delete', '-f', id]);
    const immutable = join(dataDir, 'node', 'sandboxes', stuck.id, 'upper', 'tmp', 'immutable');
    execFileSync('chattr', ['+i', immutable]);
    try {
      dsec = await startDsec(dataDir, { edgeId });
      assert.equal(existsSync(join(dataDir, 'node', 'sandboxes', deep.id)), false, 'the deep dead sandbox was not removed');
      assert.equal(existsSync(immutable), true, 'control: the immutable file really blocked its clean-up');
      const still = await Sandbox.connect(bystander.id, conn());
      assert.equal((await still.commands.run('echo served')).stdout, 'served\n', 'the edge does not serve its other sandboxes');
      await still.kill();
    } finally {
      execFileSync('chattr', ['-i', immutable]);
      // What the failed clean-up left (mounts and cgroups are already gone): the directory alone.
      rmSync(join(dataDir, 'node', 'sandboxes', stuck.id), { recursive: true, force: true });
    }
  });
});
