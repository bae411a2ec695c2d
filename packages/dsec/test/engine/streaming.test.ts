/**
 * Streaming exec (NDJSON with Accept: application/x-ndjson; SDK commands.stream, onStdout and
 * onStderr), binary-safe output and stdin (encoding: 'base64'), and a client that disconnects
 * mid-stream having its command killed.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, test } from 'node:test';
import { type Sandbox, type StreamEvent } from '@dsec/sdk';
import { useServerAndSandbox, type TestServer } from '../helpers/server.js';
import { engineBackends } from '../helpers/vm.js';
import { execNdjson, ndjsonLines, type NdjsonEvent } from './support/http.js';
import { liveProcesses, pollUntil, waitGone } from './support/sandbox-procs.js';

/** Every byte value, several times over, in a shuffled order. */
const ALL_BYTES = Buffer.concat([
  Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
  randomBytes(4096),
  Buffer.from(Array.from({ length: 256 }, (_, i) => 255 - i)),
]);

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: streaming exec (${backend})`, { skip, timeout: 300_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;

    useServerAndSandbox({ backend, resources: { memoryMiB } }, (s, b) => {
      server = s;
      sb = b;
    });

    test('NDJSON: the response is application/x-ndjson with base64 stdout/stderr lines and exactly one exit line, last', async () => {
      const res = await execNdjson(server, sb.id, { cmd: 'echo out1; echo err1 >&2; echo out2; exit 3' });
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /application\/x-ndjson/);
      const events: NdjsonEvent[] = [];
      for await (const ev of ndjsonLines(res.body!)) events.push(ev);
      const exits = events.filter((e) => e.type === 'exit');
      assert.equal(exits.length, 1, JSON.stringify(events));
      assert.equal(events.at(-1)!.type, 'exit', 'the exit line comes last');
      const out = (name: 'stdout' | 'stderr'): string =>
        Buffer.concat(
          events.filter((e): e is { type: typeof name; data: string } => e.type === name).map((e) => Buffer.from(e.data, 'base64')),
        ).toString('utf8');
      assert.equal(out('stdout'), 'out1\nout2\n');
      assert.equal(out('stderr'), 'err1\n');
      const exit = exits[0] as Record<string, unknown>;
      assert.equal(exit['exitCode'], 3);
      assert.equal(exit['timedOut'], false);
      assert.equal(exit['truncated'], false);
      assert.equal(exit['stdoutBytes'], 10);
      assert.equal(exit['stderrBytes'], 5);
      assert.equal(typeof exit['durationMs'], 'number');
      assert.equal(exit['stdout'], undefined, 'the exit line does not repeat the output');
    });

    test('NDJSON: output is delivered while the command is still running (before it exits)', async () => {
      const release = `/tmp/release-${randomBytes(4).toString('hex')}`;
      const res = await execNdjson(server, sb.id, { cmd: `echo first; while [ ! -e ${release} ]; do sleep 0.05; done; echo second` });
      assert.equal(res.status, 200);
      const it = ndjsonLines(res.body!);
      const first = await it.next();
      assert.equal(first.done, false);
      assert.deepEqual(
        { type: first.value!.type, data: Buffer.from((first.value as { data: string }).data, 'base64').toString() },
        { type: 'stdout', data: 'first\n' },
      );
      // The command cannot finish until we create the release file: the line above came from a running command.
      const running = await liveProcesses(sb, new RegExp(`while \\[ ! -e ${release}`));
      assert.ok(running.length > 0, 'the command is still running after its first line was streamed');
      await sb.files.write(release, '');
      const rest: NdjsonEvent[] = [];
      for await (const ev of it) rest.push(ev);
      const stdout = rest
        .filter((e) => e.type === 'stdout')
        .map((e) => Buffer.from((e as { data: string }).data, 'base64').toString())
        .join('');
      assert.equal(stdout, 'second\n');
      assert.equal(rest.at(-1)!.type, 'exit');
      assert.equal((rest.at(-1) as Record<string, unknown>)['exitCode'], 0);
    });

    test('SDK commands.stream yields stdout and stderr bytes as they come, then the exit status', async () => {
      const events: StreamEvent[] = [];
      for await (const ev of sb.commands.stream('for i in 1 2 3; do echo o$i; echo e$i >&2; done; exit 5')) events.push(ev);
      const text = (t: 'stdout' | 'stderr'): string =>
        Buffer.concat(
          events.filter((e): e is Extract<StreamEvent, { type: 'stdout' | 'stderr' }> => e.type === t).map((e) => Buffer.from(e.data)),
        ).toString();
      assert.equal(text('stdout'), 'o1\no2\no3\n');
      assert.equal(text('stderr'), 'e1\ne2\ne3\n');
      const exit = events.at(-1)!;
      assert.equal(exit.type, 'exit');
      assert.equal((exit as { exitCode: number }).exitCode, 5);
      for (const ev of events.slice(0, -1)) assert.ok(ev.type !== 'exit' && ev.data instanceof Uint8Array, 'output events carry bytes');
    });

    test('SDK commands.run with onStdout/onStderr calls back with each chunk and still returns the whole result', async () => {
      const seen = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
      const r = await sb.commands.run('echo hello; echo oops >&2; printf tail', {
        onStdout: (c) => seen.stdout.push(Buffer.from(c)),
        onStderr: (c) => seen.stderr.push(Buffer.from(c)),
      });
      assert.equal(Buffer.concat(seen.stdout).toString(), 'hello\ntail');
      assert.equal(Buffer.concat(seen.stderr).toString(), 'oops\n');
      assert.equal(r.stdout, 'hello\ntail');
      assert.equal(r.stderr, 'oops\n');
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdoutBytes, 10);
    });

    test('NDJSON with timeoutMs: the command is killed and the exit line says timedOut true, exit code 137', async () => {
      const res = await execNdjson(server, sb.id, { cmd: 'echo started; sleep 1003', timeoutMs: 500 });
      const events: NdjsonEvent[] = [];
      for await (const ev of ndjsonLines(res.body!)) events.push(ev);
      const exit = events.at(-1) as Record<string, unknown>;
      assert.equal(exit['type'], 'exit');
      assert.equal(exit['timedOut'], true);
      assert.equal(exit['exitCode'], 137);
      assert.deepEqual(await waitGone(sb, /^sleep 1003$/), []);
    });

    test('SDK run with onStdout and timeoutMs: the command times out and the result says timedOut (not a client-side TimeoutError)', async () => {
      let chunks = 0;
      const r = await sb.commands.run('echo started; sleep 1013', { timeoutMs: 1000, onStdout: () => chunks++ });
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, 137);
      assert.equal(r.stdout, 'started\n');
      assert.ok(chunks >= 1);
      assert.deepEqual(await waitGone(sb, /^sleep 1013$/), []);
    });

    test('encoding base64 (JSON exec): every byte value comes back unchanged', async () => {
      await sb.files.write('/tmp/all-bytes.bin', ALL_BYTES);
      const r = await sb.commands.run('cat /tmp/all-bytes.bin; cat /tmp/all-bytes.bin >&2', { encoding: 'base64' });
      assert.equal(r.encoding, 'base64');
      assert.ok(Buffer.from(r.stdout, 'base64').equals(ALL_BYTES), 'stdout bytes differ');
      assert.ok(Buffer.from(r.stderr, 'base64').equals(ALL_BYTES), 'stderr bytes differ');
      assert.equal(r.stdoutBytes, ALL_BYTES.length);
    });

    test('encoding base64 with onStdout: the callback gets raw bytes and the result is base64 of them', async () => {
      await sb.files.write('/tmp/all-bytes-2.bin', ALL_BYTES);
      const chunks: Buffer[] = [];
      const r = await sb.commands.run('cat /tmp/all-bytes-2.bin', { encoding: 'base64', onStdout: (c) => chunks.push(Buffer.from(c)) });
      assert.ok(Buffer.concat(chunks).equals(ALL_BYTES), 'streamed bytes differ');
      assert.ok(Buffer.from(r.stdout, 'base64').equals(ALL_BYTES), 'result bytes differ');
    });

    test('SDK commands.stream is binary-safe: every byte value arrives unchanged', async () => {
      await sb.files.write('/tmp/all-bytes-3.bin', ALL_BYTES);
      const chunks: Uint8Array[] = [];
      for await (const ev of sb.commands.stream('cat /tmp/all-bytes-3.bin')) if (ev.type === 'stdout') chunks.push(ev.data);
      assert.ok(Buffer.concat(chunks).equals(ALL_BYTES));
    });

    test('stdin with stdinEncoding base64 delivers every byte value to the command unchanged', async () => {
      const r = await sb.commands.run('cat', { stdin: ALL_BYTES.toString('base64'), stdinEncoding: 'base64', encoding: 'base64' });
      assert.equal(r.exitCode, 0);
      assert.ok(Buffer.from(r.stdout, 'base64').equals(ALL_BYTES));
      const sum = await sb.commands.run('md5sum', { stdin: ALL_BYTES.toString('base64'), stdinEncoding: 'base64' });
      const { createHash } = await import('node:crypto');
      assert.equal(sum.stdout.split(' ')[0], createHash('md5').update(ALL_BYTES).digest('hex'));
    });

    test('a multi-megabyte stream arrives complete and in order (backpressure loses nothing)', async () => {
      // 4 MiB of numbered lines, read slowly enough that the server has to pause the command.
      const lines = 200_000;
      let received = 0;
      let text = '';
      let bad = 0;
      let next = 1;
      for await (const ev of sb.commands.stream(`seq 1 ${lines}`, { maxOutputBytes: 16 << 20 })) {
        if (ev.type !== 'stdout') continue;
        received += ev.data.length;
        text += Buffer.from(ev.data).toString();
        const parts = text.split('\n');
        text = parts.pop()!;
        for (const p of parts) if (Number(p) !== next++) bad++;
        if (received < 64 << 10) await new Promise((r) => setTimeout(r, 5));
      }
      assert.equal(bad, 0, 'lines out of order or missing');
      assert.equal(next - 1, lines);
    });

    test('NDJSON exit line carries truncated and the full byte counts when output passes maxOutputBytes', async () => {
      const res = await execNdjson(server, sb.id, { cmd: 'head -c 100000 /dev/zero', maxOutputBytes: 1000 });
      const events: NdjsonEvent[] = [];
      for await (const ev of ndjsonLines(res.body!)) events.push(ev);
      const kept = events
        .filter((e) => e.type === 'stdout')
        .reduce((n, e) => n + Buffer.from((e as { data: string }).data, 'base64').length, 0);
      assert.equal(kept, 1000, 'only the first maxOutputBytes are streamed');
      const exit = events.at(-1) as Record<string, unknown>;
      assert.equal(exit['type'], 'exit');
      assert.equal(exit['truncated'], true);
      assert.equal(exit['stdoutBytes'], 100000);
    });

    test('uncapped: true streams every byte past maxOutputBytes, and the exit line does not say truncated', async () => {
      let bytes = 0;
      let exit: StreamEvent | undefined;
      for await (const ev of sb.commands.stream('head -c 3000000 /dev/zero', { maxOutputBytes: 1000, uncapped: true })) {
        if (ev.type === 'exit') exit = ev;
        else bytes += ev.data.length;
      }
      assert.equal(bytes, 3_000_000);
      assert.ok(exit?.type === 'exit');
      assert.equal(exit.truncated, false);
      assert.equal(exit.stdoutBytes, 3_000_000);
    });

    test('uncapped: true on a buffered (JSON) exec is refused with 400 naming the field', async () => {
      await assert.rejects(sb.commands.run('true', { uncapped: true }), (err: unknown) => {
        const e = err as { status?: number; code?: string; details?: Record<string, unknown> };
        return e.status === 400 && e.code === 'INVALID_REQUEST' && e.details?.['field'] === 'uncapped';
      });
    });

    test('a client that aborts a streaming exec mid-stream has its command killed (no `sleep 1001` left)', async () => {
      const ctrl = new AbortController();
      const res = await execNdjson(server, sb.id, { cmd: 'echo ready; sleep 1001; echo never' }, ctrl.signal);
      const it = ndjsonLines(res.body!);
      const first = await it.next();
      assert.equal(first.value?.type, 'stdout', 'the command started');
      // Looked for until seen: "ready" is written by the shell before it forks and execs sleep, so
      // a listing at once can find only the shell (it did, once, under a full suite's load).
      assert.ok(
        await pollUntil(async () => (await liveProcesses(sb, /^sleep 1001$/)).length > 0),
        'sleep 1001 runs while the stream is open',
      );
      ctrl.abort();
      await it.return(undefined).catch(() => undefined);
      assert.deepEqual(await waitGone(sb, /^sleep 1001$/), [], 'sleep 1001 must be killed when the client goes away');
    });

    test('NDJSON: the response (status and headers) starts before the command writes any output', async () => {
      // A silent command: if the server held the headers back until the first output line, the
      // fetch would only resolve once the command had ended (here, at its 5 s timeout).
      const res = await execNdjson(server, sb.id, { cmd: ['sleep', '1006'], timeoutMs: 5000 });
      assert.equal(res.status, 200);
      // The headers may come while the command is still starting: it is looked for until the
      // stream ends. Had they waited for the command's end, it would be gone and never seen.
      const rest: NdjsonEvent[] = [];
      let ended = false;
      const reading = (async () => {
        for await (const ev of ndjsonLines(res.body!)) rest.push(ev);
        ended = true;
      })();
      let seen = false;
      while (!seen && !ended) {
        seen = (await liveProcesses(sb, /^sleep 1006$/)).length > 0;
        if (!seen) await new Promise((r) => setTimeout(r, 50));
      }
      await reading;
      assert.ok(seen, `the response only began after the silent command had ended (exit: ${JSON.stringify(rest.at(-1))})`);
    });

    test('a client that aborts a streaming exec before any output has its command killed too', async () => {
      const ctrl = new AbortController();
      const pending = execNdjson(server, sb.id, { cmd: ['sleep', '1002'] }, ctrl.signal);
      pending.catch(() => undefined);
      let started = false;
      for (let i = 0; i < 100 && !started; i++) {
        started = (await liveProcesses(sb, /^sleep 1002$/)).length > 0;
        if (!started) await new Promise((r) => setTimeout(r, 50));
      }
      assert.ok(started, 'sleep 1002 started');
      ctrl.abort();
      await pending.then((res) => res.body?.cancel()).catch(() => undefined);
      assert.deepEqual(await waitGone(sb, /^sleep 1002$/), []);
    });

    test('breaking out of SDK commands.stream disconnects and kills the command', async () => {
      for await (const ev of sb.commands.stream('echo go; sleep 1004')) {
        if (ev.type === 'stdout') break;
      }
      assert.deepEqual(await waitGone(sb, /^sleep 1004$/), []);
    });

    test('a JSON (non-streaming) exec whose client hangs up has its command killed', async () => {
      const ctrl = new AbortController();
      const pending = sb.commands.run('sleep 1005', { signal: ctrl.signal });
      pending.catch(() => undefined);
      let started = false;
      for (let i = 0; i < 100 && !started; i++) {
        started = (await liveProcesses(sb, /^sleep 1005$/)).length > 0;
        if (!started) await new Promise((r) => setTimeout(r, 50));
      }
      assert.ok(started, 'sleep 1005 started');
      ctrl.abort();
      await assert.rejects(pending);
      assert.deepEqual(await waitGone(sb, /^sleep 1005$/), []);
    });

    test('a streaming exec on an unknown sandbox answers 404 SANDBOX_NOT_FOUND as JSON, not a stream', async () => {
      const res = await execNdjson(server, `sb-${server.edgeId}-doesnotexist0`, { cmd: 'true' });
      assert.equal(res.status, 404);
      const body = (await res.json()) as { error: { code: string } };
      assert.equal(body.error.code, 'SANDBOX_NOT_FOUND');
    });

    test('a streaming exec with a negative timeoutMs answers 400 INVALID_REQUEST before streaming', async () => {
      const res = await execNdjson(server, sb.id, { cmd: 'true', timeoutMs: -1 });
      assert.equal(res.status, 400);
      const body = (await res.json()) as { error: { code: string } };
      assert.equal(body.error.code, 'INVALID_REQUEST');
    });

    test("a streaming exec with cmd '' answers 400 INVALID_REQUEST before streaming", async () => {
      const res = await execNdjson(server, sb.id, { cmd: '' });
      const text = await res.text();
      assert.equal(res.status, 400, text.slice(0, 300));
      assert.equal((JSON.parse(text) as { error: { code: string } }).error.code, 'INVALID_REQUEST');
    });

    test('the sandbox still runs after all the killed and aborted streams', async () => {
      const r = await sb.commands.run('echo alive');
      assert.equal(r.stdout, 'alive\n');
      assert.equal((await sb.refresh()).status, 'running');
    });
  });
