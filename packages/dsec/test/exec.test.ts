/** Running commands in a sandbox: output, env, cwd, argv, stdin, exit codes, timeouts, output caps. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CommandExitError, InvalidRequestError, type Sandbox, type ExecResult } from '@dsec/sdk';
import { integrationSkipReason, useServerAndSandbox, type TestServer } from './helpers/server.js';
import { call } from './helpers/wire.js';
import { connect, type Socket } from 'node:net';

/** Processes in the sandbox that are still alive (zombies excluded) whose args start with `prefix`. */
async function liveProcesses(sb: Sandbox, prefix: string): Promise<string[]> {
  const r = await sb.commands.run(['ps', '-o', 'stat,args']);
  assert.equal(r.exitCode, 0, r.stderr);
  return r.stdout
    .split('\n')
    .slice(1)
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('Z'))
    .map((l) => l.replace(/^\S+\s+/, ''))
    .filter((args) => args.startsWith(prefix));
}

describe('exec', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  useServerAndSandbox({ resources: { memoryMiB: 64 }, env: { FROM_CREATE: 'create-value', SHARED: 'from-create' } }, (s, b) => {
    server = s;
    sb = b;
  });

  test('echo hi: stdout is "hi\\n", exit code 0, nothing else', async () => {
    const r = await sb.commands.run('echo hi');
    assert.equal(r.stdout, 'hi\n');
    assert.equal(r.stderr, '');
    assert.equal(r.exitCode, 0);
    assert.equal(r.truncated, false);
    assert.equal(r.timedOut, false);
    assert.equal(r.stdoutBytes, 3);
    assert.equal(r.stderrBytes, 0);
    assert.equal(typeof r.durationMs, 'number');
  });

  test('stderr is returned separately from stdout', async () => {
    const r = await sb.commands.run('echo out; echo err >&2');
    assert.equal(r.stdout, 'out\n');
    assert.equal(r.stderr, 'err\n');
  });

  test('env given at create is visible to every command', async () => {
    const r = await sb.commands.run('echo "$FROM_CREATE"');
    assert.equal(r.stdout, 'create-value\n');
  });

  test('env given at exec is visible, and overrides env from create', async () => {
    const r = await sb.commands.run('echo "$FROM_EXEC $SHARED $FROM_CREATE"', { env: { FROM_EXEC: 'exec-value', SHARED: 'from-exec' } });
    assert.equal(r.stdout, 'exec-value from-exec create-value\n');
    const later = await sb.commands.run('echo "${FROM_EXEC:-unset} $SHARED"');
    assert.equal(later.stdout, 'unset from-create\n', 'exec env does not stick to the sandbox');
  });

  test('the image env (PATH, HOME) is set', async () => {
    const r = await sb.commands.run('echo "$HOME"; echo "$PATH"');
    assert.equal(r.stdout.split('\n')[0], '/root');
    assert.ok(r.stdout.includes('/usr/bin'), r.stdout);
  });

  test('commands run as the image user (root) from the image cwd (/) by default', async () => {
    const r = await sb.commands.run('id -u; pwd');
    assert.equal(r.stdout, '0\n/\n');
  });

  test('the cwd option sets the working directory', async () => {
    const r = await sb.commands.run('pwd', { cwd: '/tmp' });
    assert.equal(r.stdout, '/tmp\n');
  });

  test('a cwd that does not exist is refused (InvalidRequestError naming cwd and the path), not run', async () => {
    await assert.rejects(sb.commands.run('pwd', { cwd: '/no/such/dir' }), (err: unknown) => {
      assert.ok(err instanceof InvalidRequestError, String(err));
      assert.equal(err.details['field'], 'cwd');
      assert.match(err.message, /cwd \/no\/such\/dir does not exist in the sandbox/);
      return true;
    });
  });

  test('argv form runs the program directly, without a shell', async () => {
    const r = await sb.commands.run(['echo', '$HOME', 'a b', '*']);
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, '$HOME a b *\n');
  });

  test("a program that does not exist: 127 and what a shell says, with no dsec helper named (an agent's observation)", async () => {
    const r = await sb.commands.run(['/no/such/program']);
    assert.equal(r.exitCode, 127);
    assert.equal(r.stderr, '/no/such/program: No such file or directory\n');
    const bare = await sb.commands.run(['nosuchcmd', '--flag']);
    assert.equal(bare.exitCode, 127);
    assert.equal(bare.stderr, 'nosuchcmd: command not found\n');
    const landlocked = await sb.commands.run(['nosuchcmd'], { writablePaths: ['/tmp'] });
    assert.equal(landlocked.stderr, 'nosuchcmd: command not found\n');
    await sb.files.write('/tmp/not-executable', 'echo x\n', { mode: 0o644 });
    const denied = await sb.commands.run(['/tmp/not-executable']);
    assert.equal(denied.exitCode, 126);
    assert.equal(denied.stderr, '/tmp/not-executable: Permission denied\n');
  });

  test('stdin is written to the command and closed', async () => {
    const r = await sb.commands.run('wc -c; echo', { stdin: 'hello\nworld\n' });
    assert.equal(r.stdout.trim(), '12');
    const cat = await sb.commands.run(['cat'], { stdin: 'line one\nline two' });
    assert.equal(cat.stdout, 'line one\nline two');
  });

  test('without stdin the command reads EOF at once', async () => {
    const r = await sb.commands.run('cat; echo done');
    assert.equal(r.stdout, 'done\n');
    assert.equal(r.timedOut, false);
  });

  test('a non-zero exit code is returned, not thrown', async () => {
    const r = await sb.commands.run('echo partial; exit 3');
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, 'partial\n');
  });

  test('throwOnError turns a non-zero exit into CommandExitError with the output', async () => {
    await assert.rejects(sb.commands.run('echo o; echo e >&2; exit 7', { throwOnError: true }), (err: unknown) => {
      assert.ok(err instanceof CommandExitError);
      assert.equal(err.exitCode, 7);
      assert.equal(err.stdout, 'o\n');
      assert.equal(err.stderr, 'e\n');
      return true;
    });
  });

  test('a command killed by a signal reports 128 + the signal number', async () => {
    const r = await sb.commands.run('kill -9 $$');
    assert.equal(r.exitCode, 137);
  });

  test('timeout (SDK): sleep 100 with timeoutMs 500 is killed, timedOut is true and no sleep is left running', async () => {
    const r = await sb.commands.run(['sleep', '100'], { timeoutMs: 500 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 137);
    assert.deepEqual(await liveProcesses(sb, 'sleep'), []);
  });

  test('timeout (HTTP API): {timeoutMs: 500} kills sleep 100, answers timedOut true and exit code 137', async () => {
    const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: ['sleep', '100'], timeoutMs: 500 } });
    assert.equal(res.status, 200, res.text);
    const r = res.json as ExecResult;
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 137);
    assert.deepEqual(await liveProcesses(sb, 'sleep'), []);
  });

  test('timeout kills the whole process tree, background children included', async () => {
    const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, {
      json: { cmd: 'sleep 1003 & sleep 1004 & sleep 1005; wait', timeoutMs: 500 },
    });
    assert.equal((res.json as ExecResult).timedOut, true);
    assert.deepEqual(await liveProcesses(sb, 'sleep'), []);
  });

  test('after a timeout the sandbox is still running and usable', async () => {
    const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: ['sleep', '100'], timeoutMs: 300 } });
    assert.equal((res.json as ExecResult).timedOut, true);
    const info = await sb.refresh();
    assert.equal(info.status, 'running');
    assert.equal((await sb.commands.run('echo still here')).stdout, 'still here\n');
  });

  test('output cap: 3,000,000 bytes with maxOutputBytes 1000 keeps 1000, counts all, sets truncated', async () => {
    const r = await sb.commands.run('yes | head -c 3000000', { maxOutputBytes: 1000 });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.truncated, true);
    assert.equal(r.stdoutBytes, 3_000_000);
    assert.equal(r.stdout.length, 1000);
    assert.equal(r.stdout, 'y\n'.repeat(500));
  });

  test('output cap applies to stderr too, per stream', async () => {
    const r = await sb.commands.run('head -c 5000 /dev/zero | tr "\\0" e >&2; echo ok', { maxOutputBytes: 100 });
    assert.equal(r.stdout, 'ok\n');
    assert.equal(r.stderr, 'e'.repeat(100));
    assert.equal(r.stderrBytes, 5000);
    assert.equal(r.truncated, true);
  });

  test('maxOutputBytes 0 keeps no output but still counts it', async () => {
    const r = await sb.commands.run('echo hello', { maxOutputBytes: 0 });
    assert.equal(r.stdout, '');
    assert.equal(r.stdoutBytes, 6);
    assert.equal(r.truncated, true);
  });

  test('output exactly at the cap is not truncated', async () => {
    const r = await sb.commands.run('printf 12345', { maxOutputBytes: 5 });
    assert.equal(r.stdout, '12345');
    assert.equal(r.truncated, false);
  });

  test('large output caps reserve the output budget: a 5th 64 MiB exec of a project is refused before it runs, default caps never are', async () => {
    // The default budget is 1024 MiB, half of it per project; a 64 MiB cap reserves 2 × 63 MiB,
    // so one project holds four such commands at once (504 MiB) and not a fifth.
    await sb.commands.run('rm -rf /tmp/budget && mkdir /tmp/budget');
    const big = { maxOutputBytes: 64 << 20, timeoutMs: 60_000 };
    const held = [0, 1, 2, 3].map((i) =>
      sb.commands.run(`touch /tmp/budget/started-${i}; while [ ! -e /tmp/budget/go ]; do sleep 0.05; done; echo done-${i}`, big),
    );
    for (;;) {
      const started = await sb.commands.run('ls /tmp/budget');
      if (started.stdout.split('\n').filter((f) => f.startsWith('started-')).length === 4) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const refused = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, {
      json: { cmd: ['touch', '/tmp/budget/fifth-ran'], ...big },
    });
    assert.equal(refused.status, 503, JSON.stringify(refused.json));
    const error = (refused.json as { error: { code: string; message: string; details: Record<string, unknown> } }).error;
    assert.equal(error.code, 'OUTPUT_BUDGET_EXCEEDED');
    assert.match(error.message, /stream the output/);
    assert.equal(error.details['ownerHeldBytes'], 4 * 126 * 2 ** 20);
    // A default cap needs no reservation: it runs, and lets the four finish.
    assert.equal(
      (await sb.commands.run('ls /tmp/budget/fifth-ran 2>&1; touch /tmp/budget/go')).stdout,
      'ls: /tmp/budget/fifth-ran: No such file or directory\n',
    );
    assert.deepEqual(
      (await Promise.all(held)).map((r) => r.stdout),
      ['done-0\n', 'done-1\n', 'done-2\n', 'done-3\n'],
    );
    // Their reservations came back with their answers.
    const again = await sb.commands.run('touch /tmp/budget/fifth-ran; echo ran', big);
    assert.equal(again.stdout, 'ran\n');
  });

  test('a client that does not read its answer holds its reservation until the connection goes', async () => {
    const big = { maxOutputBytes: 64 << 20, timeoutMs: 60_000 };
    const url = new URL(server.url);
    // Four 64 MiB-cap execs of 24 MiB each, on sockets that read only the answer's first bytes:
    // past what the kernel's buffers take, each body waits in the server for its client.
    const sockets = await Promise.all(
      [0, 1, 2, 3].map(
        (i) =>
          new Promise<Socket>((resolve, reject) => {
            const body = JSON.stringify({ cmd: ['sh', '-c', `head -c ${24 << 20} /dev/zero | tr '\\0' ${'abcd'[i]}`], ...big });
            const s = connect(Number(url.port), url.hostname, () =>
              s.write(
                `POST /v1/sandboxes/${sb.id}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${server.apiKey}\r\n` +
                  `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
              ),
            );
            s.once('data', (first) => {
              s.pause(); // the answer has been made and is being sent: read no more
              if (!first.toString('latin1').startsWith('HTTP/1.1 200')) reject(new Error(first.toString('latin1', 0, 300)));
              else resolve(s);
            });
            s.once('error', reject);
          }),
      ),
    );
    try {
      const refused = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: ['true'], ...big } });
      assert.equal(refused.status, 503, 'the four answers, made but unread, still hold 4 × 126 MiB');
      assert.equal((refused.json as { error: { code: string } }).error.code, 'OUTPUT_BUDGET_EXCEEDED');
    } finally {
      for (const s of sockets) s.destroy();
    }
    for (let tries = 0; ; tries++) {
      const r = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: ['echo', 'ok'], ...big } });
      if (r.status === 200) break;
      assert.ok(tries < 200, `still refused after the clients went: ${JSON.stringify(r.json)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  });

  test('a result whose JSON is far larger than its output (control bytes) is refused with how the command ended', async () => {
    const r = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, {
      json: {
        cmd: ['sh', '-c', `for fd in 1 2; do head -c ${48 << 20} /dev/zero | tr '\\0' '\\001' >&$fd; done; exit 3`],
        maxOutputBytes: 64 << 20,
      },
    });
    assert.equal(r.status, 507, JSON.stringify(r.json).slice(0, 300));
    const error = (r.json as { error: { code: string; message: string; details: Record<string, unknown> } }).error;
    assert.equal(error.code, 'RESULT_TOO_LARGE'); // not retryable: it ran
    assert.match(error.message, /the command ran \(exit code 3\)/);
    assert.match(error.message, /encoding base64/);
    assert.deepEqual(
      [error.details['ran'], error.details['exitCode'], error.details['stdoutBytes'], error.details['retryable']],
      [true, 3, 48 << 20, false],
    );
    // Nothing stays reserved: four large commands fit again.
    const four = await Promise.all([0, 1, 2, 3].map(() => sb.commands.run('echo ok', { maxOutputBytes: 64 << 20 })));
    assert.deepEqual(
      four.map((x) => x.stdout),
      ['ok\n', 'ok\n', 'ok\n', 'ok\n'],
    );
  });

  test("a sandbox's background processes keep at most two at the largest cap; a third is refused before it starts, room comes back at exit", async () => {
    const big = { maxOutputBytes: 64 << 20 };
    const running = [await sb.commands.start('sleep 600', big), await sb.commands.start('sleep 600', big)];
    const refused = await call(server, 'POST', `/v1/sandboxes/${sb.id}/processes`, {
      json: { cmd: ['sh', '-c', 'touch /tmp/third-ran; sleep 600'], ...big },
    });
    assert.equal(refused.status, 503, JSON.stringify(refused.json));
    const error = (refused.json as { error: { code: string; message: string } }).error;
    assert.equal(error.code, 'OUTPUT_BUDGET_EXCEEDED');
    assert.match(error.message, /background processes may keep/);
    assert.equal((await sb.commands.run('ls /tmp/third-ran 2>&1')).stdout, 'ls: /tmp/third-ran: No such file or directory\n');
    // A default cap needs no room; an exited process's room is taken back by the next start.
    const small = await sb.commands.start('echo small', {});
    await small.wait();
    await running[0]!.kill();
    await running[0]!.wait();
    const third = await sb.commands.start('echo third', big);
    assert.equal((await third.wait()).exitCode, 0);
    await running[1]!.kill();
  });

  test('commands see only the sandbox processes (own PID namespace)', async () => {
    const r = await sb.commands.run(['ps', '-o', 'pid,args']);
    const pids = r.stdout.split('\n').slice(1).filter(Boolean);
    assert.ok(pids.length < 10, `the sandbox sees ${pids.length} processes:\n${r.stdout}`);
    assert.ok(!r.stdout.includes('node'), 'the host node process is not visible');
  });

  test('a caller that hangs up kills its command', async () => {
    const abort = new AbortController();
    const pending = fetch(`${server.url}/v1/sandboxes/${sb.id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ cmd: ['sleep', '1006'], timeoutMs: 600_000 }),
      signal: abort.signal,
    }).catch((err: Error) => err);
    // Wait (bounded by this exec's own timeout) until the command runs, then hang up.
    const started = await sb.commands.run(`until ps -o args | grep -q '^sleep 1006'; do sleep 0.05; done; echo started`, {
      timeoutMs: 30_000,
    });
    assert.equal(started.stdout, 'started\n', 'the long command never started');
    abort.abort();
    assert.ok((await pending) instanceof Error, 'the aborted request rejects');
    const gone = await sb.commands.run(`while ps -o stat,args | grep -v '^Z' | grep -q 'sleep 1006$'; do sleep 0.05; done; echo gone`, {
      timeoutMs: 30_000,
    });
    assert.equal(gone.timedOut, false, 'the command kept running after its caller hung up');
    assert.equal(gone.stdout, 'gone\n');
  });

  test('concurrent execs in one sandbox each get their own output', async () => {
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => sb.commands.run(`echo ${i}; echo err${i} >&2`)));
    results.forEach((r, i) => {
      assert.equal(r.stdout, `${i}\n`);
      assert.equal(r.stderr, `err${i}\n`);
    });
  });

  test('40 concurrent execs each return their complete output (none is cut off when crun exits first)', async () => {
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) => sb.commands.run(['echo', `line-${i}`])));
    const lost = results.map((r, i) => ({ i, r })).filter(({ r, i }) => r.stdout !== `line-${i}\n`);
    assert.deepEqual(
      lost.map(({ i, r }) => `#${i}: exit ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}, stdoutBytes ${r.stdoutBytes}`),
      [],
      'exec answered without the output the command wrote',
    );
  });

  test('the exec response body has every documented field', async () => {
    const res = await call(server, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: 'echo hi' } });
    assert.equal(res.status, 200);
    const body = res.json as Record<string, unknown>;
    for (const k of ['exitCode', 'stdout', 'stderr', 'truncated', 'stdoutBytes', 'stderrBytes', 'timedOut', 'durationMs']) {
      assert.ok(k in body, `missing ${k}`);
    }
  });
});
