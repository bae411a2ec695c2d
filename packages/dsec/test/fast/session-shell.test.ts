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
import { withoutBashOwn } from '../../src/edge/backends/shared/session-state.js';
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

describe('bash session commands on the host’s bash', { skip: which('bash') ? undefined : 'no bash on this host' }, () => {
  let dir: string;
  let session: ShellSession;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-session-bash-'));
    session = new ShellSession(hostShellSessionHost({ '/bin/bash': [which('bash')!] }), { cwd: dir }, true);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  const run = (cmd: string) => session.exec({ cmd });
  const tricky = `$'a\\ndeclare -i RANDOM\\ndeclare -r UID="7"\\ndeclare -- _="x"\\nz'`;

  test('values that look like the statements of bash’s own variables, arrays, attributes and cwd carry over whole', async () => {
    assert.equal(session.shell, '/bin/bash');
    const set = await run(
      `TRICKY=${tricky}; Q='say "hi" \\ $HOME \`x\`'; A=(1 "two words" $'t\\tab'); declare -A M=([k]=v ["a b"]=$'c\\nd'); ` +
        `declare -i N=41; export E=1; PS4='++ '; cd /tmp`,
    );
    assert.equal(set.exitCode, 0, set.stderr);
    const r = await run(`N+=1; printf '%s|' "$TRICKY" "$Q" "\${A[@]}" "\${M[k]}" "\${M[a b]}" "$N" "$E" "$PS4" "$PWD"`);
    assert.equal(
      r.stdout,
      `a\ndeclare -i RANDOM\ndeclare -r UID="7"\ndeclare -- _="x"\nz|say "hi" \\ $HOME \`x\`|1|two words|t\tab|v|c\nd|42|1|++ |/tmp|`,
    );
  });

  test('options carry over, turned on and off (shopt and set -o), and errexit from the last of them', async () => {
    const set = await run('shopt -s extglob nullglob; shopt -u checkwinsize sourcepath; set -o pipefail -o noglob; set +o braceexpand');
    assert.equal(set.exitCode, 0, set.stderr);
    const r = await run(
      'shopt -q extglob && shopt -q nullglob && ! shopt -q checkwinsize && ! shopt -q sourcepath && [[ -o pipefail && -o noglob && ! -o braceexpand ]] && echo same; ' +
        'f() { [[ x == @(x|y) ]] && echo extglob-parsed; }; f',
    );
    assert.equal(r.stdout, 'same\nextglob-parsed\n', r.stderr);
    assert.equal((await run('f')).stdout, 'extglob-parsed\n', 'a function using extglob, restored with extglob on');
    await run('shopt -u extglob nullglob; shopt -s checkwinsize sourcepath; set +o pipefail +o noglob; set -o braceexpand; set -e');
    const e = await run('false; echo not-reached');
    assert.equal(e.stdout, '', 'errexit restored');
    assert.notEqual(e.exitCode, 0);
  });

  test('the restore leaves out what a fresh bash has of its own (read-only, dynamic, emptied) and keeps what the session set', () => {
    const script = session.carry().state!.script;
    const restored = withoutBashOwn(script);
    for (const own of [
      'declare -ar BASH_VERSINFO=',
      'declare -i RANDOM\n',
      'declare -a BASH_SOURCE=()',
      'declare -ir EUID=',
      'declare -a PIPESTATUS=',
    ])
      assert.ok(script.includes(own) && !restored.replaceAll(`TRICKY=${tricky}`, '').includes(own), own);
    for (const kept of [`declare -- TRICKY=${tricky}`, 'declare -i N="42"', 'declare -x E="1"', 'declare -- PS4="++ "', 'declare -A M='])
      assert.ok(restored.includes(kept), `${kept} in ${restored.slice(0, 2000)}`);
    assert.ok(script.length - restored.length > 800, `${restored.length} of ${script.length} bytes`);
  });
});

test('a value bash printed with newlines inside its quotes (bash before 5.2 did) is kept whole, however its lines read', () => {
  const script = [
    'declare -- X="one',
    'declare -i RANDOM',
    'declare -r UID=\\"0\\"',
    'two"',
    "declare -- Y='three",
    "declare -a FUNCNAME'",
    'declare -i RANDOM',
    "declare -a A=([0]=\"x\" [1]=$'it\\'s\\ndeclare -- _')",
    'declare -ir UID="0"',
    'f () ',
    '{ ',
    '    echo declare -i RANDOM',
    '}',
  ].join('\n');
  assert.equal(
    withoutBashOwn(script),
    [
      'declare -- X="one',
      'declare -i RANDOM',
      'declare -r UID=\\"0\\"',
      'two"',
      "declare -- Y='three",
      "declare -a FUNCNAME'",
      "declare -a A=([0]=\"x\" [1]=$'it\\'s\\ndeclare -- _')",
      'f () ',
      '{ ',
      '    echo declare -i RANDOM',
      '}',
    ].join('\n'),
  );
});
