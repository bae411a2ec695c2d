/**
 * Red team, resource exhaustion: a fork bomb, `yes` flat out to stdout and to a file, and
 * allocation past the memory limit. Each must hit its limit inside the sandbox and leave the
 * host, the server (which runs in this process) and other sandboxes working. Defences named:
 * pids.max of the sandbox's pids cgroup (pids.events "max" counts the refused forks), the exec
 * output cap (maxOutputBytes: kept bytes bounded, the rest counted), the size-limited upper
 * filesystem (ENOSPC, "No space left on device"), and the memory cgroup's OOM killer
 * (exec oomKilled, inspect usage.oomKills).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync, statfsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { cgroupPids } from '../../src/host/cgroups.js';
import { integrationSkipReason, sandboxCgroupDir, startTestServer, type TestServer } from '../helpers/server.js';
import { assertBystanderUnaffected, attack, inspect, must, show } from './support/harness.js';

const MiB = 1 << 20;

function readInt(file: string): number {
  return Number(readFileSync(file, 'utf8').trim());
}

/** Free bytes of the filesystem holding `dir`, as statfs (and df) report them. */
function freeBytes(dir: string): number {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

describe('red team: resource exhaustion', { skip: integrationSkipReason(), timeout: 900_000 }, () => {
  let server: TestServer;
  let bystander: Sandbox;

  before(async () => {
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
  });
  after(async () => {
    await server?.close();
  });

  test('fork bomb with pids 64: held at pids.max, another sandbox still execs, kill leaves nothing behind', async () => {
    const bomb = await Sandbox.create({ ...server.conn, labels: { role: 'fork-bomb' }, resources: { pids: 64, cpu: 0.5 } });
    const cg = sandboxCgroupDir('pids', bomb.id);
    assert.equal(readFileSync(join(cg, 'pids.max'), 'utf8').trim(), '64', 'the sandbox pids.max is not its resources.pids');
    let killed = false;
    try {
      // The classic bomb, with a busybox-sh-friendly name; it runs in the background (its own exec
      // could not even fork once the cgroup is full).
      await bomb.commands.start(['sh', '-c', 'bomb() { bomb | bomb & }; bomb']);
      let peak = 0;
      let sawMax = false;
      for (let i = 0; i < 120; i++) {
        await new Promise((r) => setTimeout(r, 250));
        const current = readInt(join(cg, 'pids.current'));
        peak = Math.max(peak, current);
        assert.ok(current <= 64, `pids.current ${current} is over pids.max 64`);
        if (/^max [1-9]/m.test(readFileSync(join(cg, 'pids.events'), 'utf8'))) sawMax = true;
        if (sawMax && i >= 8) break;
      }
      assert.ok(sawMax, `the bomb never hit pids.max (peak ${peak}): pids.events ${readFileSync(join(cg, 'pids.events'), 'utf8')}`);
      assert.ok(peak <= 64);
      // The host and other sandboxes still work while the bomb runs.
      const other = await attack(server, bystander, 'echo ok; ps -o pid | wc -l');
      assert.equal(other.exitCode, 0, `the bystander could not exec during the fork bomb: ${show(other)}`);
      assert.match(other.stdout, /^ok\n/);
      execFileSync('true'); // the host can fork
      const usage = (await inspect(server, bomb.id)).usage;
      assert.ok(usage && usage.pids <= 64, `inspect usage.pids ${usage?.pids}`);

      await bomb.kill();
      killed = true;
      assert.equal(existsSync(cg), false, 'the bomb pids cgroup is still there after kill');
      assert.deepEqual(cgroupPids(`dsec/${bomb.id}`), [], 'bomb processes survived the kill');
      const list = await inspect(server, bomb.id).catch((err: { status?: number }) => err);
      assert.equal((list as { status?: number }).status, 404, 'the killed sandbox is still listed');
    } finally {
      if (!killed) await bomb.kill().catch(() => undefined);
    }
  });

  test('`yes` to stdout for 10 s: output capped at maxOutputBytes (truncated, bytes counted), server memory bounded', async () => {
    const maxOutputBytes = 1 * MiB;
    const rss0 = process.memoryUsage().rss;
    let peak = rss0;
    const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
    const sb = await Sandbox.create({ ...server.conn, labels: { role: 'yes' } });
    let r;
    try {
      r = await attack(server, sb, ['yes'], { timeoutMs: 10_000, maxOutputBytes });
    } finally {
      clearInterval(sampler);
      await sb.kill();
    }
    peak = Math.max(peak, process.memoryUsage().rss);
    assert.equal(r.timedOut, true, show(r));
    assert.equal(r.truncated, true, 'a 10 s `yes` was not truncated');
    assert.ok(
      Buffer.byteLength(r.stdout) <= maxOutputBytes,
      `kept ${Buffer.byteLength(r.stdout)} bytes > maxOutputBytes ${maxOutputBytes}`,
    );
    assert.ok(r.stdoutBytes > 16 * MiB, `only ${r.stdoutBytes} bytes counted: the command was not producing flat out?`);
    assert.ok(r.stdoutBytes > Buffer.byteLength(r.stdout));
    const growth = (peak - rss0) / MiB;
    assert.ok(
      growth < 100,
      `the server process grew by ${growth.toFixed(1)} MiB while ${(r.stdoutBytes / MiB).toFixed(0)} MiB went through it`,
    );
  });

  test('`yes > /file` with diskMiB 32: No space left on device inside; the host disk loses at most ~the limit', async () => {
    const sb = await Sandbox.create({ ...server.conn, labels: { role: 'disk-filler' }, resources: { diskMiB: 32 } });
    try {
      const before = freeBytes(server.dataDir);
      const dfBefore = execFileSync('df', ['-B1', '--output=avail', server.dataDir], { encoding: 'utf8' });
      const r = await attack(server, sb, 'yes > /file; echo "rc=$?"; ls -l /file', { timeoutMs: 120_000 });
      assert.equal(r.timedOut, false, show(r));
      assert.match(r.stderr, /No space left on device/, `expected ENOSPC from the sandbox's own disk: ${show(r)}`);
      assert.match(r.stdout, /rc=[1-9]/);
      const size = Number(/\s(\d+)\s+\w{3}\s+\d+\s+[\d:]+\s+\/file/.exec(r.stdout)?.[1] ?? 0);
      assert.ok(size > 0 && size <= 32 * MiB, `the file inside is ${size} bytes`);
      // The limit is the sandbox's own filesystem image: its blocks on the host are bounded by it.
      const img = join(server.dsec.edge.records.paths(sb.id).dir, 'disk.img');
      const allocated = statSync(img).blocks * 512;
      assert.ok(allocated <= 33 * MiB, `the sandbox disk image uses ${(allocated / MiB).toFixed(1)} MiB on the host`);
      // Host free space (statfs, what df shows). Other work on this machine also uses the disk; the
      // bound is loose on purpose.
      const drop = (before - freeBytes(server.dataDir)) / MiB;
      const dfAfter = execFileSync('df', ['-B1', '--output=avail', server.dataDir], { encoding: 'utf8' });
      assert.ok(drop < 64, `host free space dropped by ${drop.toFixed(1)} MiB (df before/after: ${dfBefore.trim()} / ${dfAfter.trim()})`);
      // The sandbox (and writes elsewhere) still work; removing the file frees its space.
      await must(server, sb, 'rm /file && echo small > /small && cat /small');
    } finally {
      await sb.kill();
    }
  });

  test('allocate past memoryMiB 32: the OOM killer stops it (exec oomKilled, inspect usage.oomKills), the sandbox survives', async () => {
    const sb = await Sandbox.create({ ...server.conn, labels: { role: 'memory-hog' }, resources: { memoryMiB: 32 } });
    try {
      const limit = readInt(join(sandboxCgroupDir('memory', sb.id), 'memory.limit_in_bytes'));
      assert.equal(limit, 32 * MiB, 'the memory cgroup limit is not resources.memoryMiB');
      // tail keeps its last "line": 200 MiB of zeros with no newline, all in memory.
      const r = await attack(server, sb, 'dd if=/dev/zero bs=1M count=200 2>/dev/null | tail -n 1 | wc -c', { timeoutMs: 120_000 });
      assert.equal(r.oomKilled, true, `exec result oomKilled is not true: ${show(r)}`);
      assert.notEqual(r.stdout.trim(), String(200 * MiB), 'tail got all 200 MiB through a 32 MiB limit');
      const info = await inspect(server, sb.id);
      assert.ok((info.usage?.oomKills ?? 0) >= 1, `inspect usage.oomKills: ${JSON.stringify(info.usage)}`);
      // The sandbox's peak since create: dsec's record (each command resets v1's one high-water mark
      // after crediting it, host/memory-peaks.ts), not the raw mark, which covers only since then.
      assert.ok(
        info.usage?.peakMemoryBytes !== undefined && info.usage.peakMemoryBytes > 16 * MiB,
        `the peak saw the hog: ${JSON.stringify(info.usage)}`,
      );
      assert.ok(info.usage.peakMemoryBytes <= 32 * MiB, `memory use went past the limit: ${JSON.stringify(info.usage)}`);
      assert.ok(r.peakMemoryBytes !== undefined && r.peakMemoryBytes <= 32 * MiB, `the command's peak stayed within the limit: ${show(r)}`);
      // An awk string that doubles past the limit: killed the same way.
      const awk = await attack(server, sb, `awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'`, { timeoutMs: 120_000 });
      assert.equal(awk.oomKilled, true, show(awk));
      assert.equal(awk.exitCode, 137, show(awk));
      // The sandbox itself is still there and works.
      assert.equal((await must(server, sb, 'echo alive')).stdout, 'alive\n');
      assert.equal((await inspect(server, sb.id)).status, 'running');
    } finally {
      await sb.kill();
    }
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander);
  });
});
