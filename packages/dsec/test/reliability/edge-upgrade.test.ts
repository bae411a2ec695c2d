/**
 * An edge upgrade with live sandboxes: a sandbox made by an older build has that build's
 * dsec-landlock bound at /dev/.dsec-landlock, and the new edge passes it flags it may not know
 * (`--cgroup-fd`, where crun exec starts a command through it). The restarted edge binds the
 * current binary over it when it adopts the sandbox (edge/helper-binds.ts), in a user-namespaced
 * sandbox and in an opt-out one alike. A plain command does not go through the binary at all: its
 * starter applies the Landlock domain itself (native/enter-core.c).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Sandbox, type DsecError } from '@dsec/sdk';
import { LANDLOCK_BINARY } from '../../src/host/native-helpers.js';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';

/** packages/dsec/native/landlock-exec.c and the domain it applies, from dist/test/reliability/. */
const LANDLOCK_SOURCE = fileURLToPath(new URL('../../../native/landlock-exec.c', import.meta.url));
const DOMAIN_SOURCE = fileURLToPath(new URL('../../../native/landlock-domain.c', import.meta.url));

/**
 * A build of dsec-landlock from before `--cgroup-fd`: the same source with the flag renamed, so
 * it rejects `--cgroup-fd` with its usage error as an older build does.
 */
function buildOldLandlock(dir: string): string {
  const src = join(dir, 'old-landlock.c');
  writeFileSync(src, readFileSync(LANDLOCK_SOURCE, 'utf8').replaceAll('"--cgroup-fd"', '"--cgroup-fd-not-yet"'));
  const out = join(dir, 'old-landlock');
  execFileSync('gcc', ['-O2', '-static', '-I', dirname(LANDLOCK_SOURCE), '-o', out, src, DOMAIN_SOURCE]);
  return out;
}

const skip = integrationSkipReason();

for (const userns of [true, false]) {
  describe(`an edge upgrade replaces the dsec-landlock of the sandboxes it adopts (userns: ${userns})`, { skip, timeout: 120_000 }, () => {
    const edgeId = newEdgeId();
    let dataDir = '';
    let buildDir = '';
    let first: RunningDsec | undefined;
    let second: RunningDsec | undefined;
    let sb: Sandbox;
    let pid = 0;
    let staleRun: { exitCode: number; stdout: string; stderr: string };
    let broken: Sandbox;

    before(async () => {
      buildDir = mkdtempSync(join(tmpdir(), 'dsec-upgrade-'));
      const oldBinary = buildOldLandlock(buildDir);
      dataDir = makeDataDir();
      first = await startDsec(dataDir, { edgeId, userns });
      sb = await Sandbox.create({ url: first.url, apiKey: first.apiKey, resources: { memoryMiB: 64 } });
      // The old build, put where the sandbox's own bind of it would be had it been made before the upgrade.
      await sb.files.write('/tmp/old-landlock', readFileSync(oldBinary), { mode: 0o755 });
      const crunRoot = join(dataDir, 'node', 'crun');
      const initPid = (id: string) =>
        (JSON.parse(execFileSync('crun', ['--root', crunRoot, 'state', id], { encoding: 'utf8' })) as { pid: number }).pid;
      pid = initPid(sb.id);
      execFileSync('nsenter', [
        '-t',
        String(pid),
        '-m',
        '-r',
        '/dev/.dsec-tools/busybox',
        'mount',
        '--bind',
        '/tmp/old-landlock',
        '/dev/.dsec-landlock',
      ]);
      // A sandbox whose binary cannot be replaced: its /dev/.dsec-landlock leads nowhere.
      broken = await Sandbox.create({ url: first.url, apiKey: first.apiKey, resources: { memoryMiB: 64 } });
      // In a user-namespaced sandbox its /dev is its own root's: the change is made as that root.
      const inBroken = (...args: string[]) =>
        execFileSync('nsenter', [
          '-t',
          String(initPid(broken.id)),
          ...(userns ? ['-U'] : []),
          '-m',
          '-r',
          '/dev/.dsec-tools/busybox',
          ...args,
        ]);
      inBroken('umount', '/dev/.dsec-landlock');
      inBroken('rm', '/dev/.dsec-landlock');
      inBroken('ln', '-s', '/nowhere', '/dev/.dsec-landlock');
      staleRun = await sb.commands.run('echo ran');
      await first.close(); // the sandbox keeps running; the next start is the "upgraded" edge
      second = await startDsec(dataDir, { edgeId, userns });
    });

    after(async () => {
      await first?.close({ killAll: true });
      await second?.close({ killAll: true });
      if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
      if (buildDir) rmSync(buildDir, { recursive: true, force: true });
    });

    test('with the old build in place, a command still runs: its starter applies the Landlock domain without the binary', () => {
      assert.equal(staleRun.exitCode, 0, staleRun.stderr);
      assert.equal(staleRun.stdout, 'ran\n');
    });

    test('after the restart a command runs, in its own command cgroup, through the current build', async () => {
      const s = await Sandbox.connect(sb.id, { url: second!.url, apiKey: second!.apiKey });
      const r = await s.commands.run(['sh', '-c', 'echo ran; grep ^0:: /proc/self/cgroup']);
      assert.equal(r.exitCode, 0, r.stderr);
      assert.match(r.stdout, /^ran\n0::\/cmd-[0-9a-f]+\n$/);
      const inside = readFileSync(`/proc/${pid}/root/dev/.dsec-landlock`);
      assert.ok(inside.equals(readFileSync(LANDLOCK_BINARY)), "the sandbox's /dev/.dsec-landlock is this build's");
    });

    test('a sandbox whose binary could not be replaced refuses commands with the reason, not a usage error', async () => {
      const s = await Sandbox.connect(broken.id, { url: second!.url, apiKey: second!.apiKey });
      await assert.rejects(s.commands.run('echo ran'), (err: DsecError) => {
        assert.equal(err.code, 'SANDBOX_NOT_RUNNING', err.message);
        assert.match(err.message, /made by an older dsec .*could not be replaced.*ENOENT.*recreate it/);
        return true;
      });
    });
  });
}
