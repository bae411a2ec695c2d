/* eslint-disable @typescript-eslint/no-explicit-any -- wire bodies are checked field by field */
/**
 * Persistent shell sessions: cwd, env and shell variables persist; each command gets its own
 * output and exit code; a timed-out or abandoned command is interrupted and the session answers
 * the next one; a syntax error (sh and bash) does not end the session; commands queue; and each
 * session command is a shell of its own (its status comes on the shell's own fd 3, see
 * test/security/session-forgery.test.ts), the idle session holding only its next shell.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { Sandbox, type Session } from '@dsec/sdk';
import { startTestServer, type TestServer } from '../helpers/server.js';
import { containerOnly, engineBackends } from '../helpers/vm.js';
import { buildBusyboxBashImage } from './support/bash-image.js';
import { callJson } from './support/http.js';
import { hostExecStarters, liveProcesses, pollUntil, waitGone } from './support/sandbox-procs.js';
import { ISOLATE_COMMANDS } from '../../src/edge/backends/container/exec/exec-target.js';

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: sessions (${backend})`, { skip, timeout: 300_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;

    /** Session exec over raw HTTP, so timeoutMs reaches the server as the command's timeout. */
    async function sessionExec(
      sandbox: Sandbox,
      sid: string,
      body: Record<string, unknown>,
      signal?: AbortSignal,
    ): Promise<{ status: number; body: any }> {
      return callJson(server, 'POST', `/v1/sandboxes/${sandbox.id}/sessions/${sid}/exec`, body, { signal });
    }

    async function ok(s: Session, cmd: string): Promise<string> {
      const r = await s.run(cmd);
      assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
      return r.stdout;
    }

    before(async () => {
      server = await startTestServer();
      await buildBusyboxBashImage(server.dsec.images);
      sb = await Sandbox.create({ ...server.conn, backend, resources: { memoryMiB } });
    });
    after(async () => {
      await server?.close();
    });

    test('a new session on busybox (auto) runs /bin/sh and reports alive, not busy, no commands', async () => {
      const s = await sb.sessions.create();
      assert.match(s.id, /^ss-[a-z0-9]+$/);
      assert.equal(s.info.shell, '/bin/sh');
      assert.equal(s.info.alive, true);
      assert.equal(s.info.busy, false);
      assert.equal(s.info.commands, 0);
      await s.close();
    });

    test('the state outlives every command, however its three pipes are scheduled (state on fd 3 read after the markers)', async () => {
      // The state pipe and the output pipes are read independently: a command whose markers were
      // read before its state's last bytes must still hand the state on, never end the session.
      const s = await sb.sessions.create();
      await s.run(`BIG=$(head -c 200000 /dev/zero | tr '\\0' x); cd /tmp`);
      for (let i = 0; i < 40; i++) {
        const r = await s.run(`N=$((\${N:-0}+1)); echo \${#BIG} $PWD $N`);
        assert.equal(r.stdout, `200000 /tmp ${i + 1}\n`, `command ${i + 1}: ${JSON.stringify(r)}`);
        assert.equal(r.sessionAlive, true, `command ${i + 1} left the session alive`);
      }
      await s.close();
    });

    test('cd persists across commands', async () => {
      const s = await sb.sessions.create();
      await ok(s, 'mkdir -p /tmp/sess-cd && cd /tmp/sess-cd');
      assert.equal(await ok(s, 'pwd'), '/tmp/sess-cd\n');
      await s.close();
    });

    test('exported env and plain shell variables persist across commands (sh); unset and multi-line values too', async () => {
      const s = await sb.sessions.create();
      await ok(s, "export EXPORTED=e1; PLAIN=p1; ML='line one\nit'\\''s two'; unset HOME");
      assert.equal(await ok(s, 'echo "$EXPORTED $PLAIN"'), 'e1 p1\n');
      assert.equal(await ok(s, 'sh -c \'echo "${EXPORTED}-${PLAIN:-unset}"\''), 'e1-unset\n', 'exported reaches children, plain does not');
      assert.equal(await ok(s, 'printf "%s|" "$ML" "${HOME-gone}"'), "line one\nit's two|gone|");
      await s.close();
    });

    test('bash sessions also keep functions, arrays and aliases', async () => {
      const bsb = await Sandbox.create({ ...server.conn, backend, image: 'busybox-bash', resources: { memoryMiB } });
      try {
        const s = await bsb.sessions.create();
        await ok(s, 'greet() { echo "hi $1"; }; arr=(a "b c"); declare -i n=4; shopt -s expand_aliases; alias hey="echo hey"');
        assert.equal(await ok(s, 'greet there; echo "${arr[1]} $((n+1))"'), 'hi there\nb c 5\n');
        assert.equal(await ok(s, 'hey'), 'hey\n');
        await s.close();
      } finally {
        await bsb.kill();
      }
    });

    test('cwd and env given at open apply to the session', async () => {
      const s = await sb.sessions.create({ cwd: '/tmp', env: { OPENED_WITH: 'yes' } });
      assert.equal(await ok(s, 'pwd; echo $OPENED_WITH'), '/tmp\nyes\n');
      await s.close();
    });

    test('each command gets its own stdout, stderr and exit code', async () => {
      const s = await sb.sessions.create();
      const a = await s.run('echo one; echo e-one >&2');
      const b = await s.run('echo two; false');
      const c = await s.run('(exit 7)');
      assert.deepEqual([a.stdout, a.stderr, a.exitCode], ['one\n', 'e-one\n', 0]);
      assert.deepEqual([b.stdout, b.stderr, b.exitCode], ['two\n', '', 1]);
      assert.deepEqual([c.stdout, c.exitCode], ['', 7]);
      assert.equal(c.sessionAlive, true);
      await s.close();
    });

    test('output without a trailing newline, empty output and a lone newline come back exactly', async () => {
      const s = await sb.sessions.create();
      assert.equal((await s.run('printf abc')).stdout, 'abc');
      assert.equal((await s.run('printf err >&2')).stderr, 'err');
      assert.equal((await s.run('true')).stdout, '');
      assert.equal((await s.run('echo')).stdout, '\n');
      assert.equal((await s.run('printf "a\\n\\n"')).stdout, 'a\n\n');
      await s.close();
    });

    test('a session command reads EOF on stdin, so it cannot swallow the commands after it', async () => {
      const s = await sb.sessions.create();
      const r = await s.run('cat; read x; echo "read:$? x:[$x]"');
      assert.equal(r.stdout, 'read:1 x:[]\n');
      assert.equal((await s.run('echo next')).stdout, 'next\n');
      await s.close();
    });

    test('session output is capped by maxOutputBytes and counted past the cap', async () => {
      const s = await sb.sessions.create();
      const r = await s.run('head -c 100000 /dev/zero | tr "\\0" x', { maxOutputBytes: 1000 });
      assert.equal(r.stdout, 'x'.repeat(1000));
      assert.equal(r.stdoutBytes, 100000);
      assert.equal(r.truncated, true);
      assert.equal((await s.run('echo after')).stdout, 'after\n');
      await s.close();
    });

    test('session output with encoding base64 is binary-safe', async () => {
      const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
      await sb.files.write('/tmp/sess-bytes.bin', bytes);
      const s = await sb.sessions.create();
      const r = await s.run('cat /tmp/sess-bytes.bin', { encoding: 'base64' });
      assert.ok(Buffer.from(r.stdout, 'base64').equals(bytes));
      await s.close();
    });

    test('a timed-out session command is interrupted (timedOut, 137) and the session answers the next command with its state intact', async () => {
      const s = await sb.sessions.create();
      await ok(s, 'cd /tmp; KEEP=kept');
      const r = await sessionExec(sb, s.id, { cmd: 'sleep 3001; echo never', timeoutMs: 500 });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.timedOut, true);
      assert.equal(r.body.exitCode, 137);
      assert.equal(r.body.sessionAlive, true);
      assert.deepEqual(await waitGone(sb, /^sleep 3001$/), []);
      assert.equal(await ok(s, 'echo "$PWD $KEEP"'), '/tmp kept\n');
      await s.close();
    });

    test('a timed-out session command has its whole tree killed (pipelines and background children)', async () => {
      const s = await sb.sessions.create();
      const r = await sessionExec(sb, s.id, { cmd: 'sleep 3011 & sleep 3012 | cat; wait', timeoutMs: 500 });
      assert.equal(r.body.timedOut, true);
      assert.deepEqual(await waitGone(sb, /^sleep 301[12]$/), []);
      assert.equal(await ok(s, 'echo alive'), 'alive\n');
      await s.close();
    });

    test('SDK Session.run with timeoutMs: the command is interrupted server-side and the result says timedOut', async () => {
      const s = await sb.sessions.create();
      const r = await s.run('sleep 3021', { timeoutMs: 1000 });
      assert.equal(r.timedOut, true);
      assert.equal(r.sessionAlive, true);
      await s.close();
    });

    test('a builtin-only busy loop that times out returns (timedOut) and the session then answers or reports SESSION_CLOSED', async () => {
      const s = await sb.sessions.create();
      const r = await sessionExec(sb, s.id, { cmd: 'while :; do :; done', timeoutMs: 500 });
      assert.equal(r.status, 200);
      assert.equal(r.body.timedOut, true);
      const next = await sessionExec(sb, s.id, { cmd: 'echo back' });
      if (next.status === 200) assert.equal(next.body.stdout, 'back\n');
      else {
        assert.equal(next.status, 409, JSON.stringify(next.body));
        assert.equal(next.body.error.code, 'SESSION_CLOSED');
        assert.equal(r.body.sessionAlive === false || (await sb.sessions.list()).find((x) => x.id === s.id)?.info.alive === false, true);
      }
      await s.close().catch(() => undefined);
    });

    test('a client that hangs up on a session command has it interrupted; the session lives on', async () => {
      const s = await sb.sessions.create();
      const ctrl = new AbortController();
      const pending = sessionExec(sb, s.id, { cmd: 'sleep 3031' }, ctrl.signal);
      pending.catch(() => undefined);
      assert.ok(await pollUntil(async () => (await liveProcesses(sb, /^sleep 3031$/)).length > 0), 'sleep 3031 started');
      ctrl.abort();
      await pending.catch(() => undefined);
      assert.deepEqual(await waitGone(sb, /^sleep 3031$/), []);
      assert.equal(await ok(s, 'echo still here'), 'still here\n');
      await s.close();
    });

    test('a syntax error in sh fails that command (non-zero, message on stderr) but does not end the session', async () => {
      const s = await sb.sessions.create({ shell: 'sh' });
      await ok(s, 'BEFORE=set; cd /tmp');
      for (const bad of ['echo (', 'if then fi', 'echo "unterminated', 'done']) {
        const r = await s.run(bad);
        assert.notEqual(r.exitCode, 0, `${bad} should fail`);
        assert.match(r.stderr, /syntax|unexpected|unterminated|expecting/i, `${bad}: ${r.stderr}`);
        assert.equal(r.sessionAlive, true, `${bad} ended the session`);
      }
      assert.equal(await ok(s, 'echo "$BEFORE $PWD"'), 'set /tmp\n');
      await s.close();
    });

    test('a syntax error in bash fails that command but does not end the session', async () => {
      const bsb = await Sandbox.create({ ...server.conn, backend, image: 'busybox-bash', resources: { memoryMiB } });
      try {
        const s = await bsb.sessions.create();
        assert.equal(s.info.shell, '/bin/bash', 'auto picks bash when the image has it');
        await ok(s, 'BEFORE=set; cd /tmp; arr=(a b c)');
        for (const bad of ['echo (', 'if then fi', 'echo "unterminated', 'done', 'f() {']) {
          const r = await s.run(bad);
          assert.notEqual(r.exitCode, 0, `${bad} should fail`);
          assert.match(r.stderr, /syntax|unexpected/i, `${bad}: ${r.stderr}`);
          assert.equal(r.sessionAlive, true, `${bad} ended the session`);
        }
        assert.equal(await ok(s, 'echo "$BEFORE $PWD ${arr[1]}"'), 'set /tmp b\n');
        await s.close();
      } finally {
        await bsb.kill();
      }
    });

    test('commands sent while one runs queue behind it and run in order (busy while running)', async () => {
      const s = await sb.sessions.create();
      const tag = randomBytes(4).toString('hex');
      const first = s.run(
        `rm -f /tmp/order-${tag}; touch /tmp/started-${tag}; while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done; echo one >> /tmp/order-${tag}; echo first`,
      );
      assert.ok(await pollUntil(() => sb.files.exists(`/tmp/started-${tag}`)), 'the first command started');
      const second = s.run(`echo two >> /tmp/order-${tag}; cat /tmp/order-${tag}`);
      const third = s.run(`echo three >> /tmp/order-${tag}; cat /tmp/order-${tag}`);
      const listed = (await sb.sessions.list()).find((x) => x.id === s.id)!;
      assert.equal(listed.info.busy, true, 'the session is busy while a command runs');
      assert.equal(await sb.files.exists(`/tmp/order-${tag}`), false, 'nothing queued behind the first command has run yet');
      await sb.files.write(`/tmp/go-${tag}`, '');
      const [a, b, c] = await Promise.all([first, second, third]);
      assert.equal(a.stdout, 'first\n');
      // The two queued commands ran one after the other, after the first (in whichever order their requests arrived).
      const final = (await sb.files.readText(`/tmp/order-${tag}`)).split('\n').filter(Boolean);
      assert.equal(final[0], 'one');
      assert.deepEqual([...final.slice(1)].sort(), ['three', 'two']);
      const serial = [b.stdout, c.stdout].sort((x, y) => x.length - y.length);
      assert.deepEqual(serial, [`one\n${final[1]}\n`, `one\n${final[1]}\n${final[2]}\n`]);
      const after = (await sb.sessions.list()).find((x) => x.id === s.id)!;
      assert.equal(after.info.busy, false);
      assert.equal(after.info.commands, 3);
      await s.close();
    });

    test('forty commands queued at once each run in their own process, one after the other, and none ends the session', async () => {
      // A queued command starts the moment the previous one's markers are in, before that one's
      // crun exec has been reaped: nothing of one command (its pid file, its cgroup) may be
      // handed to or removed under the next. Both once were: the next command was killed as
      // "cannot move the command into its cgroup" and the session reported ended.
      const s = await sb.sessions.create();
      const runs = Array.from({ length: 40 }, (_, i) => s.run(`N=$((\${N:-0}+1)); echo ${i} $N`));
      const results = await Promise.all(runs);
      results.forEach((r, i) => {
        assert.equal(r.exitCode, 0, `command ${i}: ${r.stderr}`);
        assert.equal(r.stdout, `${i} ${i + 1}\n`, `command ${i} ran ${i + 1}th, after the state of the ones before`);
        assert.equal(r.sessionAlive, true);
      });
      await s.close();
    });

    test(
      'each session command has a starter of its own on the host (dsec-enter, or crun exec); an idle session holds one, its next shell started ahead, and a closed one none',
      containerOnly(backend, "counts command starters on the host (a VM session command is the agent's exec: vm.test.ts)"),
      async () => {
        const own = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
        try {
          const s = await own.sessions.create();
          const firstShell = (await s.run('echo $$')).stdout;
          // Where every command has a Landlock domain of its own, the next command's shell is
          // started ahead (ShellSession.prepare) and waits for its program: one starter. Elsewhere none.
          const idle = ISOLATE_COMMANDS ? 1 : 0;
          assert.ok(await pollUntil(() => hostExecStarters(own.id).length === idle), `an idle session holds ${idle} command starter(s)`);
          const tag = randomBytes(4).toString('hex');
          const running = s.run(`touch /tmp/s-${tag}; while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done; echo $$`);
          assert.ok(await pollUntil(() => own.files.exists(`/tmp/s-${tag}`)), 'the session command started');
          // The shell waiting ahead became this command: no second one is started while it runs.
          assert.equal(hostExecStarters(own.id).length, 1, 'a running session command is one starter (dsec-enter or crun exec)');
          await own.files.write(`/tmp/go-${tag}`, '');
          const r = await running;
          assert.notEqual(r.stdout, firstShell, 'each command runs in a shell of its own');
          assert.ok(await pollUntil(() => hostExecStarters(own.id).length === idle), 'after it, the next one waits again');
          await s.close();
          // The shell waiting ahead is let go at close, not waited for (a frozen one goes at the thaw).
          assert.ok(
            await pollUntil(() => hostExecStarters(own.id).length === 0),
            `a closed session holds no starter: ${hostExecStarters(own.id).join(',')}`,
          );
        } finally {
          await own.kill();
        }
      },
    );

    test('two sessions in one sandbox are independent (cwd and variables)', async () => {
      const a = await sb.sessions.create();
      const b = await sb.sessions.create();
      await ok(a, 'cd /tmp; V=a');
      await ok(b, 'cd /root; V=b');
      assert.equal(await ok(a, 'echo $PWD $V'), '/tmp a\n');
      assert.equal(await ok(b, 'echo $PWD $V'), '/root b\n');
      await a.close();
      await b.close();
    });

    test('`exit` in a session ends it: the result says sessionAlive false, later commands get 409 SESSION_CLOSED', async () => {
      const s = await sb.sessions.create();
      const r = await s.run('exit 3');
      assert.equal(r.sessionAlive, false);
      assert.equal(r.exitCode, 3);
      const next = await sessionExec(sb, s.id, { cmd: 'echo hi' });
      assert.equal(next.status, 409, JSON.stringify(next.body));
      assert.equal(next.body.error.code, 'SESSION_CLOSED');
      await s.close().catch(() => undefined);
    });

    test('a background job started in a session keeps running after its command returns', async () => {
      const s = await sb.sessions.create();
      const r = await s.run('sleep 3041 & echo started');
      assert.equal(r.stdout, 'started\n');
      // The job's fork may not have exec'd sleep yet when the command's answer comes (it shows as
      // a copy of the shell until then): polled, not read once.
      let jobs: string[] = [];
      await pollUntil(async () => (jobs = await liveProcesses(sb, /^sleep 3041$/)).length === 1, { tries: 20 });
      assert.equal(jobs.length, 1, `the job: ${JSON.stringify(jobs)}`);
      await s.close();
    });

    test(
      "the answer comes with the command's markers, not at its shell's exit: a shell still in its EXIT trap does not hold it",
      containerOnly(
        backend,
        "the guest agent reports the end of a command's fd 3 with its exit (vm-process.ts): a VM session waits for it",
      ),
      async () => {
        const s = await sb.sessions.create();
        // The shell's exit runs the trap, a foreground sleep holding the output pipes: an answer
        // that waited for the shell's exit would wait for it (and time out at 60 s, 137).
        const r = await s.run("trap 'sleep 3061' EXIT; echo hi; (exit 5)");
        assert.equal(r.exitCode, 5, r.stderr);
        assert.equal(r.stdout, 'hi\n');
        assert.equal(r.timedOut, false);
        let trapped: string[] = [];
        await pollUntil(async () => (trapped = await liveProcesses(sb, /^sleep 3061$/)).length === 1, { tries: 20 });
        assert.equal(trapped.length, 1, 'the shell answered for was not in its EXIT trap');
        // The next command is a shell of its own, with the state the first one saved.
        assert.equal(await ok(s, 'echo next'), 'next\n');
        await s.close();
        assert.deepEqual(await waitGone(sb, /^sleep 3061$/), [], "the trap's process outlived its session");
      },
    );

    test('closing a session kills what it left running in the background', async () => {
      const s = await sb.sessions.create();
      await ok(s, 'sleep 3051 & sleep 3052 & echo ok');
      let jobs: string[] = [];
      await pollUntil(async () => (jobs = await liveProcesses(sb, /^sleep 305[12]$/)).length === 2, { tries: 20 });
      assert.equal(jobs.length, 2, `the jobs: ${JSON.stringify(jobs)}`);
      await s.close();
      assert.deepEqual(await waitGone(sb, /^sleep 305[12]$/), [], 'processes of a closed session must not outlive it');
    });

    test('a session that asks for bash in a sandbox without /bin/bash is refused at open (400), not ended by its first command', async (t) => {
      if (await sb.files.exists('/bin/bash')) return t.skip("this backend's test image has bash");
      const r = await callJson(server, 'POST', `/v1/sandboxes/${sb.id}/sessions`, { shell: 'bash' });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'INVALID_REQUEST');
      assert.match(r.body.error.message, /no \/bin\/bash; use 'sh'/);
    });

    test('a closed session is gone: exec answers 404 SESSION_NOT_FOUND and it is not listed; closing it again succeeds', async () => {
      const s = await sb.sessions.create();
      await s.close();
      await s.close(); // idempotent, like kill
      const r = await sessionExec(sb, s.id, { cmd: 'true' });
      assert.equal(r.status, 404);
      assert.equal(r.body.error.code, 'SESSION_NOT_FOUND');
      assert.equal(
        (await sb.sessions.list()).some((x) => x.id === s.id),
        false,
      );
    });

    test('sessions list shows open sessions with their command counts', async () => {
      const s = await sb.sessions.create();
      await s.run('true');
      await s.run('true');
      const listed = (await sb.sessions.list()).find((x) => x.id === s.id)!;
      assert.equal(listed.info.commands, 2);
      assert.equal(listed.info.alive, true);
      await s.close();
    });
  });
