/**
 * Per-command timeouts (kill the command's whole process tree, never the sandbox or other
 * commands; report timedOut) and output caps (bytes past maxOutputBytes are counted, not kept),
 * including the server's memory staying bounded while `yes` runs flat out for 10 s.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type Sandbox } from '@dsec/sdk';
import { useServerAndSandbox, type TestServer } from '../helpers/server.js';
import { engineBackends } from '../helpers/vm.js';
import { execJson, execNdjson, ndjsonLines } from './support/http.js';
import { liveProcesses, pollUntil, waitGone } from './support/sandbox-procs.js';

const MiB = 1 << 20;

/** Runs `fn` while sampling this process's RSS (the server runs in-process); returns the peak growth. */
async function peakRssGrowth<T>(fn: () => Promise<T>): Promise<{ result: T; growthMiB: number; baseMiB: number }> {
  (globalThis as { gc?: () => void }).gc?.();
  const base = process.memoryUsage().rss;
  let peak = base;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  try {
    const result = await fn();
    peak = Math.max(peak, process.memoryUsage().rss);
    return { result, growthMiB: (peak - base) / MiB, baseMiB: base / MiB };
  } finally {
    clearInterval(sampler);
  }
}

for (const { backend, skip } of engineBackends())
  describe(`engine: timeouts, output caps and memory (${backend})`, { skip, timeout: 300_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;

    useServerAndSandbox({ backend, resources: { memoryMiB: 256 } }, (s, b) => {
      server = s;
      sb = b;
    });

    test('timeout kills the whole tree: background children and nested shells are gone; timedOut true, exit 137', async () => {
      const r = await execJson(server, sb.id, { cmd: 'sleep 2001 & sh -c "sleep 2002 & sleep 2003" & sleep 2004', timeoutMs: 1000 });
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, 137);
      assert.deepEqual(await waitGone(sb, /^sleep 200[1-4]$/), []);
    });

    test('timeout kills a grandchild that was orphaned (its parent shell exited) while the command ran', async () => {
      // `( sleep 2011 & )`: the subshell exits at once, so sleep 2011 is reparented away from the command.
      const r = await execJson(server, sb.id, { cmd: '( sleep 2011 & ); sleep 2012', timeoutMs: 1000 });
      assert.equal(r.timedOut, true);
      assert.deepEqual(await waitGone(sb, /^sleep 201[12]$/), [], 'a process the command started outlived its timeout');
    });

    test('timeout kills a command that ignores SIGTERM', async () => {
      const r = await execJson(server, sb.id, { cmd: "trap '' TERM INT HUP; sleep 2021; sleep 2021", timeoutMs: 800 });
      assert.equal(r.timedOut, true);
      assert.deepEqual(await waitGone(sb, /sleep 2021/), []);
    });

    test('a timeout kills only its own command: the sandbox, a background process and a concurrent exec live on', async () => {
      const bg = await sb.commands.start(['sleep', '2031']);
      const concurrent = execJson(server, sb.id, {
        cmd: 'while [ ! -e /tmp/release-2032 ]; do sleep 0.05; done; echo survived',
        timeoutMs: 120_000,
      });
      const r = await execJson(server, sb.id, { cmd: 'sleep 2033', timeoutMs: 500 });
      assert.equal(r.timedOut, true);
      assert.deepEqual(await waitGone(sb, /^sleep 2033$/), []);
      // Looked for until seen: the start answered before sleep was exec'd. One the timeout killed never comes back.
      assert.ok(await pollUntil(async () => (await liveProcesses(sb, /^sleep 2031$/)).length === 1), 'the background process survives');
      await sb.files.write('/tmp/release-2032', '');
      const c = await concurrent;
      assert.equal(c.stdout, 'survived\n');
      assert.equal(c.timedOut, false);
      assert.equal((await sb.refresh()).status, 'running');
      assert.equal((await sb.commands.run('echo still')).stdout, 'still\n');
      await bg.kill();
    });

    test('a command that finishes in time reports timedOut false and its own exit code', async () => {
      const r = await execJson(server, sb.id, { cmd: 'exit 4', timeoutMs: 60_000 });
      assert.equal(r.timedOut, false);
      assert.equal(r.exitCode, 4);
    });

    test('output cap: stdout keeps maxOutputBytes, stdoutBytes counts everything, truncated is true', async () => {
      const r = await execJson(server, sb.id, { cmd: 'head -c 250000 /dev/zero | tr "\\0" a', maxOutputBytes: 4096 });
      assert.equal(r.stdout.length, 4096);
      assert.equal(r.stdout, 'a'.repeat(4096));
      assert.equal(r.stdoutBytes, 250000);
      assert.equal(r.truncated, true);
    });

    test('output cap is per stream: a small stderr is kept whole while stdout is truncated', async () => {
      const r = await execJson(server, sb.id, { cmd: 'head -c 10000 /dev/zero; echo small >&2', maxOutputBytes: 100 });
      assert.equal(r.stdoutBytes, 10000);
      assert.equal(Buffer.byteLength(r.stdout), 100);
      assert.equal(r.stderr, 'small\n');
      assert.equal(r.stderrBytes, 6);
      assert.equal(r.truncated, true);
    });

    test('output cap with encoding base64 keeps exactly maxOutputBytes bytes (before encoding)', async () => {
      const r = await execJson(server, sb.id, { cmd: 'head -c 5000 /dev/urandom', maxOutputBytes: 333, encoding: 'base64' });
      assert.equal(Buffer.from(r.stdout, 'base64').length, 333);
      assert.equal(r.stdoutBytes, 5000);
    });

    test('maxOutputBytes 0 keeps nothing but counts every byte', async () => {
      const r = await execJson(server, sb.id, { cmd: 'echo hello; echo world >&2', maxOutputBytes: 0 });
      assert.equal(r.stdout, '');
      assert.equal(r.stderr, '');
      assert.equal(r.stdoutBytes, 6);
      assert.equal(r.stderrBytes, 6);
      assert.equal(r.truncated, true);
    });

    test('`yes` for 10 s through exec: truncated, stdoutBytes past the cap, and server memory grows < 100 MiB', async () => {
      const cap = MiB;
      const {
        result: r,
        growthMiB,
        baseMiB,
      } = await peakRssGrowth(() => execJson(server, sb.id, { cmd: ['yes'], timeoutMs: 10_000, maxOutputBytes: cap }));
      assert.equal(r.timedOut, true);
      assert.equal(r.truncated, true);
      assert.equal(r.stdout.length, cap);
      assert.ok(r.stdoutBytes > cap, `stdoutBytes ${r.stdoutBytes} should exceed the cap ${cap}`);
      assert.ok(
        growthMiB < 100,
        `RSS grew ${growthMiB.toFixed(1)} MiB (from ${baseMiB.toFixed(0)} MiB) while yes wrote ${(r.stdoutBytes / MiB).toFixed(0)} MiB`,
      );
      assert.deepEqual(await waitGone(sb, /^yes$/), []);
    });

    test('`yes` for 10 s through a streaming exec: only the cap is streamed, and server memory grows < 100 MiB', async () => {
      const cap = 256 << 10;
      const { result, growthMiB } = await peakRssGrowth(async () => {
        const res = await execNdjson(server, sb.id, { cmd: ['yes'], timeoutMs: 10_000, maxOutputBytes: cap });
        let streamed = 0;
        let exit: Record<string, unknown> | undefined;
        for await (const ev of ndjsonLines(res.body!)) {
          if (ev.type === 'stdout') streamed += Buffer.from(ev.data, 'base64').length;
          if (ev.type === 'exit') exit = ev;
        }
        return { streamed, exit: exit! };
      });
      assert.equal(result.streamed, cap);
      assert.equal(result.exit['truncated'], true);
      assert.ok((result.exit['stdoutBytes'] as number) > cap);
      assert.ok(growthMiB < 100, `RSS grew ${growthMiB.toFixed(1)} MiB`);
    });

    test('`yes` as a background process: output past the cap is counted, not kept; memory grows < 100 MiB', async () => {
      const cap = 64 << 10;
      const { result, growthMiB } = await peakRssGrowth(async () => {
        const p = await sb.commands.start(['yes'], { maxOutputBytes: cap });
        // Let it run until it has written well past the cap, then kill it.
        for (let i = 0; i < 200; i++) {
          const info = (await p.output({ stdoutOffset: cap })).process;
          if (info.stdoutBytes > 50 * MiB) break;
          await new Promise((r) => setTimeout(r, 50));
        }
        const killed = await p.kill();
        const out = await p.output();
        return { killed, out };
      });
      assert.equal(result.killed.status, 'exited');
      assert.equal(result.out.stdout.length, cap);
      assert.equal(result.out.process.truncated, true);
      assert.ok(result.out.process.stdoutBytes > cap);
      assert.ok(growthMiB < 100, `RSS grew ${growthMiB.toFixed(1)} MiB`);
    });
  });
