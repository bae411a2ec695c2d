/**
 * What a trainer logs: a sandbox's usage on inspect (CPU time, memory now and at its peak, the
 * disk its upper takes, bytes on its link) and each command's figures (CPU time, the memory peak
 * while it ran, its wait before it started), in the answer and in the trajectory; file steps with
 * their duration. Real sandboxes, real cgroups: every figure is made to move by a command that
 * does a known amount of work, and compared with one that does not.
 */
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { describe, test } from 'node:test';
import type { Sandbox } from '@dsec/sdk';
import { pollUntil } from './engine/support/sandbox-procs.js';
import { integrationSkipReason, useServerAndSandbox } from './helpers/server.js';

const MiB = 1 << 20;
/** A busybox sh loop that burns a fixed amount of CPU (about half a second here, whatever the load). */
const BUSY = 'i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done';

describe('usage and per-command figures', { skip: integrationSkipReason(), timeout: 180_000 }, () => {
  let sb: Sandbox;
  useServerAndSandbox({ resources: { memoryMiB: 256 }, network: { mode: 'allow', allow: ['169.254.250.2:8080'] } }, (_s, b) => {
    sb = b;
  });

  test("a command's CPU time counts everything it started, a sleeping one's stays small", async () => {
    const busy = await sb.commands.run(BUSY);
    assert.equal(busy.exitCode, 0, busy.stderr);
    assert.ok(busy.cpuMs !== undefined && busy.cpuMs > 50, `a busy loop used CPU: ${JSON.stringify(busy)}`);
    // The same work in a double-forked child the command does not wait for to the end: the
    // command's cgroup holds it, so its CPU time is the command's (a process's rusage would miss it).
    const child = await sb.commands.run(`(${BUSY}) & wait`);
    assert.ok(child.cpuMs! > busy.cpuMs! / 3, `a child's CPU counts: ${child.cpuMs} vs ${busy.cpuMs}`);
    const idle = await sb.commands.run('sleep 0.3');
    assert.ok(idle.cpuMs !== undefined && idle.cpuMs < busy.cpuMs! / 4, `sleep used little CPU: ${idle.cpuMs} vs ${busy.cpuMs}`);
    assert.ok(idle.durationMs >= 300, `sleep ran its 0.3 s: ${idle.durationMs}`);
    for (const r of [busy, child, idle]) assert.ok(r.queuedMs !== undefined && r.queuedMs >= 0, `queuedMs: ${r.queuedMs}`);
    // The wait is before the command: a command's own run is not in it.
    assert.ok(idle.queuedMs! < idle.durationMs, `the 0.3 s sleep is not counted as waiting: ${idle.queuedMs} vs ${idle.durationMs}`);
  });

  test("a command's memory peak is the sandbox's while it ran; the next command's starts afresh", async () => {
    // tail holds its last "line" (96 MiB of zeros, no newline) in memory, then exits.
    const big = await sb.commands.run('head -c 100663296 /dev/zero | tail -n 1 | wc -c');
    assert.equal(big.exitCode, 0, big.stderr);
    assert.ok(big.peakMemoryBytes !== undefined && big.peakMemoryBytes >= 96 * MiB, `peak while filling: ${big.peakMemoryBytes}`);
    const small = await sb.commands.run('true');
    assert.ok(
      small.peakMemoryBytes !== undefined && small.peakMemoryBytes < big.peakMemoryBytes - 64 * MiB,
      `the next command's window does not carry the last one's peak: ${small.peakMemoryBytes} vs ${big.peakMemoryBytes}`,
    );
    const usage = (await sb.refresh()).usage;
    assert.ok(usage, 'inspect gives usage');
    assert.ok(usage.peakMemoryBytes! >= big.peakMemoryBytes, `the lifetime peak keeps the fill: ${JSON.stringify(usage)}`);
    assert.ok(usage.memoryBytes < usage.peakMemoryBytes! - 64 * MiB, `memory now is below the peak: ${JSON.stringify(usage)}`);
  });

  test("overlapping commands: one that starts while another runs does not take the other's peak from it", async () => {
    // A holds 64 MiB, frees it, says so, then waits for B. B starts only after the fill (the files
    // API opens no window): on a cgroup v1 host B's start resets the sandbox's one high-water mark,
    // and A must still report the fill it had before that reset.
    const a = sb.commands.run(
      'head -c 67108864 /dev/zero | tail -n 1 | wc -c; touch /tmp/a-filled; while [ ! -e /tmp/b-started ]; do sleep 0.05; done',
      { timeoutMs: 60_000 },
    );
    for (let i = 0; !(await sb.files.exists('/tmp/a-filled')); i++) {
      assert.ok(i < 600, 'A never got past its fill');
      await new Promise((r) => setTimeout(r, 50));
    }
    const b = await sb.commands.run('touch /tmp/b-started');
    const done = await a;
    assert.equal(done.exitCode, 0, done.stderr);
    assert.ok(done.peakMemoryBytes! >= 64 * MiB, `A keeps its fill's peak across B's start: ${done.peakMemoryBytes}`);
    assert.ok(b.peakMemoryBytes! < done.peakMemoryBytes! - 32 * MiB, `B's window began after the fill: ${b.peakMemoryBytes}`);
  });

  test("inspect: CPU time, the upper's disk, bytes on the link", async () => {
    const before = (await sb.refresh()).usage!;
    const write = await sb.commands.run('head -c 8388608 /dev/urandom > /tmp/eight-mib && sync');
    assert.equal(write.exitCode, 0, write.stderr);
    // Traffic on the sandbox's own link (the /30 dsec made for it): the host sends two 100-byte UDP
    // datagrams to the sandbox's address. Whatever the sandbox's ruleset does with them, the
    // frames crossed the link (the host end's counters), and the sandbox answered the host's ARP.
    const { address } = await sb.network();
    assert.match(address ?? '', /^169\.254\./, 'the sandbox has a link-local address on its link');
    const udp = createSocket('udp4');
    for (let i = 0; i < 2; i++) await new Promise<void>((r, j) => udp.send(Buffer.alloc(100), 9, address!, (e) => (e ? j(e) : r())));
    udp.close();
    await new Promise((r) => setTimeout(r, 1100)); // the host's ARP and the datagrams on the link
    // The upper's size is measured again once its last measure is max(1 s, 20 walks) old, at most
    // 10 s (container-usage.ts): a walk slowed by a busy host keeps the old figure longer.
    let after = (await sb.refresh()).usage!;
    assert.ok(
      await pollUntil(async () => (after = (await sb.refresh()).usage!).diskBytes! >= before.diskBytes! + 8 * MiB, {
        tries: 150,
        intervalMs: 100,
      }),
      `the upper grew by the file: ${before.diskBytes} → ${after.diskBytes}`,
    );
    assert.ok(after.netRxBytes! >= before.netRxBytes! + 2 * 128, `two datagrams reached it: ${before.netRxBytes} → ${after.netRxBytes}`);
    assert.ok(after.netTxBytes! > before.netTxBytes!, `it answered the host's ARP at least: ${before.netTxBytes} → ${after.netTxBytes}`);
    assert.ok(after.cpuMs! > before.cpuMs!, `CPU time grows: ${before.cpuMs} → ${after.cpuMs}`);
  });

  test("the trajectory keeps each command's figures beside its duration, and file steps their duration", async () => {
    await sb.files.write('/tmp/from-api.txt', 'hello');
    const r = await sb.commands.run(BUSY);
    const { entries } = await sb.trajectory();
    const exec = entries.filter((e) => e.kind === 'exec').at(-1)!;
    assert.equal(exec.cpuMs, r.cpuMs);
    assert.equal(exec.peakMemoryBytes, r.peakMemoryBytes);
    assert.equal(exec.queuedMs, r.queuedMs);
    assert.equal(typeof exec.durationMs, 'number');
    const write = entries.filter((e) => e.kind === 'files.write').at(-1)!;
    assert.ok(typeof write.durationMs === 'number' && write.durationMs >= 0, `a file step has its duration: ${JSON.stringify(write)}`);
  });

  test('session commands carry the figures too', async () => {
    const s = await sb.sessions.create();
    const r = await s.run(BUSY);
    assert.ok(r.cpuMs! > 50, `a session command's CPU: ${JSON.stringify(r)}`);
    const idle = await s.run('sleep 0.3');
    assert.ok(idle.cpuMs! < r.cpuMs! / 4, `only its own command's CPU, not the session's so far: ${idle.cpuMs}`);
    assert.ok(
      idle.queuedMs !== undefined && idle.queuedMs < idle.durationMs,
      `a session command's wait: ${idle.queuedMs} vs ${idle.durationMs}`,
    );
    assert.ok(idle.peakMemoryBytes !== undefined);
    await s.close();
  });
});
