/**
 * The program a sh session feeds each command's shell (shell-session.ts), run by real shells of
 * the host that play the sandbox's /bin/sh: busybox ash (the busybox images') and dash (Debian's).
 * Each command runs exactly once, and a syntax error or a special builtin's error fails that
 * command without ending the session (`command eval`, where a plain eval would end the shell).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { which } from '../../src/host/doctor.js';
import { ShellSession } from '../../src/edge/backends/shared/shell-session.js';
import { hostShellSessionHost } from './support/host-shell.js';

const shells: [string, string[]][] = [
  ['busybox ash', ['busybox', 'sh']],
  ['dash', ['dash']],
];

for (const [name, binary] of shells)
  describe(`sh session commands on ${name}`, { skip: which(binary[0]!) ? undefined : `no ${binary[0]} on this host` }, () => {
    let dir: string;
    let session: ShellSession;
    before(() => {
      dir = mkdtempSync(join(tmpdir(), 'dsec-session-shell-'));
      session = new ShellSession(hostShellSessionHost({ '/bin/sh': binary }), { cwd: dir }, false);
    });
    after(() => rmSync(dir, { recursive: true, force: true }));

    const run = (cmd: string) => session.exec({ cmd });

    test('the session is sh, and its state carries over', async () => {
      assert.equal(session.shell, '/bin/sh');
      assert.equal((await run('V=kept; mkdir sub && cd sub')).exitCode, 0);
      assert.equal((await run('echo "$V $PWD"')).stdout, `kept ${dir}/sub\n`);
      await run(`cd ${dir}`);
    });

    test('every command runs once', async () => {
      for (const [i, cmd] of [
        'echo plain >> ran',
        'echo $(echo substitution) >> ran; X=$(echo x)',
        'set +n; echo after-set-plus-n >> ran',
        'set +n\necho next-line >> ran',
        'f() { echo function >> ran; }; f',
        'cat >> ran <<EOF\n$(echo heredoc)\nEOF',
      ].entries()) {
        const r = await run(cmd);
        assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
        assert.equal(readFileSync(join(dir, 'ran'), 'utf8').split('\n').filter(Boolean).length, i + 1, `${cmd} ran once`);
      }
      assert.deepEqual(readFileSync(join(dir, 'ran'), 'utf8').split('\n').filter(Boolean), [
        'plain',
        'substitution',
        'after-set-plus-n',
        'next-line',
        'function',
        'heredoc',
      ]);
    });

    test('a syntax error fails that command with the shell’s message and leaves the session', async () => {
      await run('BEFORE=set');
      for (const bad of ['echo (', 'if then fi', 'echo "unterminated', 'done', '; echo ok >> never']) {
        const r = await run(bad);
        assert.equal(r.exitCode, 2, `${bad}: ${JSON.stringify(r)}`);
        assert.match(r.stderr, /syntax error/i, bad);
        assert.equal(r.sessionAlive, true, `${bad} ended the session`);
      }
      assert.throws(() => readFileSync(join(dir, 'never')), /ENOENT/, 'a command that does not parse ran');
      assert.equal((await run('echo $BEFORE')).stdout, 'set\n');
    });

    test('the lines before a syntax error have run, as in bash or a script, and the session goes on', async () => {
      const r = await run('echo first-line > partial\necho (');
      assert.equal(r.exitCode, 2);
      assert.equal(readFileSync(join(dir, 'partial'), 'utf8'), 'first-line\n');
      assert.equal(r.sessionAlive, true);
    });

    test("a special builtin's error (which ends a shell in a plain eval) fails the command, not the session", async () => {
      for (const bad of ['readonly R=1; R=2', 'shift 5', 'export 1bad=2', 'set -o bogus']) {
        const r = await run(bad);
        assert.notEqual(r.exitCode, 0, `${bad}: ${JSON.stringify(r)}`);
        assert.equal(r.sessionAlive, true, `${bad} ended the session: ${r.stderr}`);
      }
      assert.equal((await run('echo $BEFORE')).stdout, 'set\n');
    });

    test("a command's own exit status and exit are its own", async () => {
      assert.equal((await run('false')).exitCode, 1);
      const r = await run('exit 7');
      assert.equal(r.exitCode, 7);
      assert.equal(r.sessionAlive, false, 'exit ends the session');
    });
  });
