/**
 * Red team, Landlock write confinement (`writablePaths`): a rollout-phase agent may edit its
 * workspace but must not change the task's tests or the toolchain, whatever it runs. Each attack
 * is tried by a command started with writablePaths=[/work/src, /tmp] and must fail with EACCES
 * from Landlock (the same write succeeds without writablePaths, so the control proves the
 * refusal is Landlock's and not a permission or read-only mount). The confinement holds for
 * descendants (a background process, a double fork), for sessions, and cannot be lifted from
 * inside: the helper is gone after exec (nothing resident), and a nested dsec-landlock only
 * narrows.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { InvalidRequestError, Sandbox } from '@dsec/sdk';
import { landlockAbi } from '../../src/host/syscalls.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { assertBystanderUnaffected, attack, must, show } from './support/harness.js';

const RW = ['/work/src', '/tmp'];
const DENIED = /Permission denied/;

function skipReason(): string | false {
  const base = integrationSkipReason();
  if (base) return base;
  return landlockAbi() > 0 ? false : 'this kernel has no Landlock';
}

describe('red team: Landlock write confinement (writablePaths)', { skip: skipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let bystander: Sandbox;

  before(async () => {
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    sb = await Sandbox.create({ ...server.conn, labels: { role: 'landlock' } });
    await must(server, sb, 'mkdir -p /work/src /work/tests && echo "assert ok" > /work/tests/test_x.py && echo "x = 1" > /work/src/x.py');
  });
  after(async () => {
    await server?.close();
  });

  test("/dev's standard nodes stay writable but cannot be replaced (issue 10: /dev/null swapped for a file, /dev/urandom for zeros)", async () => {
    const use = await attack(
      server,
      sb,
      'echo x > /dev/null && head -c 4 /dev/urandom | wc -c && echo y > /dev/shm/ok && cat /dev/shm/ok',
      { writablePaths: RW },
    );
    assert.equal(use.exitCode, 0, show(use));
    assert.equal(use.stdout, '4\ny\n');
    for (const cmd of [
      'rm /dev/null',
      'mv /tmp/.fake /dev/null',
      'rm /dev/urandom && ln -s /dev/zero /dev/urandom',
      'mknod /dev/evil c 1 3',
      'ln -s /tmp/x /dev/stdin2',
    ]) {
      const r = await attack(server, sb, `echo fake > /tmp/.fake; ${cmd}`, { writablePaths: RW });
      assert.notEqual(r.exitCode, 0, `${cmd} worked under writablePaths: ${show(r)}`);
      assert.match(r.stderr, DENIED, `${cmd}: ${show(r)}`);
    }
    const check = await must(
      server,
      sb,
      'test -c /dev/null && test -c /dev/urandom && head -c 16 /dev/urandom | od -An -tx1 | grep -vq "00 00 00 00 00 00 00 00" && echo intact',
    );
    assert.equal(check.stdout, 'intact\n');
  });

  test('a confined command cannot signal a process outside its domain (Landlock ABI 6 scoping)', async (t) => {
    if (landlockAbi() < 6) return t.skip(`this kernel's Landlock ABI is ${landlockAbi()} (signal scoping needs 6)`);
    const grader = await sb.commands.start(['sleep', '4111']);
    try {
      // Started is not yet running: wait until the grader's sleep is there to be attacked.
      for (let i = 0; i < 200 && !(await sb.commands.run(['sh', '-c', 'pidof sleep || true'])).stdout.trim(); i++)
        await new Promise((r) => setTimeout(r, 10));
      const r = await attack(server, sb, 'kill -STOP $(pidof sleep)', { writablePaths: RW });
      assert.notEqual(r.exitCode, 0, `SIGSTOP reached a process outside the command's domain: ${show(r)}`);
      assert.match(r.stderr, /not permitted/, show(r));
      const own = await attack(server, sb, 'sleep 30 & kill $!; wait $!; echo "own: $?"', { writablePaths: RW });
      assert.equal(own.stdout, 'own: 143\n', `a confined command can still signal its own processes: ${show(own)}`);
    } finally {
      await grader.kill().catch(() => undefined);
    }
  });

  test('the agent edits its workspace but cannot rewrite, delete, or replace the tests', async () => {
    const edit = await attack(
      server,
      sb,
      'echo "x = 2" > /work/src/x.py && mkdir /work/src/pkg && echo y > /tmp/scratch && cat /work/src/x.py',
      {
        writablePaths: RW,
      },
    );
    assert.equal(edit.exitCode, 0, `writing beneath the writable paths failed: ${show(edit)}`);
    assert.equal(edit.stdout, 'x = 2\n');

    for (const cmd of [
      'echo "pass" > /work/tests/test_x.py',
      ': > /work/tests/test_x.py', // truncate
      'rm /work/tests/test_x.py',
      'echo "pass" > /work/tests/conftest.py', // a new file beside the tests
      'mv /work/tests/test_x.py /work/src/moved.py', // rename out (REFER / remove)
      'ln -s /work/src/x.py /work/tests/link',
    ]) {
      const r = await attack(server, sb, cmd, { writablePaths: RW });
      assert.notEqual(r.exitCode, 0, `${cmd} succeeded under writablePaths: ${show(r)}`);
      assert.match(r.stderr, DENIED, `${cmd}: expected Landlock's EACCES: ${show(r)}`);
    }
    const tests = await must(server, sb, 'cat /work/tests/test_x.py; ls /work/tests');
    assert.equal(tests.stdout, 'assert ok\ntest_x.py\n', 'the tests changed');
  });

  test('the toolchain stays untouched (overwrite /bin/sh, install into /usr/bin), while the control without writablePaths can', async () => {
    const r = await attack(server, sb, 'cp /bin/busybox /usr/bin/evil', { writablePaths: RW });
    assert.notEqual(r.exitCode, 0, show(r));
    assert.match(r.stderr, DENIED, show(r));
    const sh = await attack(server, sb, 'rm -f /bin/sh', { writablePaths: RW });
    assert.match(sh.stderr, DENIED, show(sh));
    // Control: the same write without writablePaths works (root in its own upper): it was Landlock.
    await must(server, sb, 'cp /bin/busybox /usr/bin/allowed && rm /usr/bin/allowed');
  });

  test('descendants inherit it: a double-forked background job and a background process are confined too', async () => {
    const r = await attack(
      server,
      sb,
      "(sh -c 'sleep 0.2; (echo evil > /work/tests/bg) 2>/tmp/bg.err; echo $? > /tmp/bg.rc' &) ; sleep 1; cat /tmp/bg.rc /tmp/bg.err",
      {
        writablePaths: RW,
      },
    );
    assert.match(r.stdout, /^[1-9]\d*\n.*Permission denied/s, `the double-forked job was not confined: ${show(r)}`);
    const p = await sb.commands.start('echo evil > /work/tests/proc; echo rc=$?', { writablePaths: RW });
    const done = await p.wait({ waitMs: 30_000 });
    const out = await p.output();
    assert.match(out.stdout, /rc=[1-9]/, `background process: ${JSON.stringify({ done, out })}`);
    assert.match(out.stderr, DENIED);
  });

  test('a session opened with writablePaths confines every command in it', async () => {
    const s = await sb.sessions.create({ writablePaths: RW });
    try {
      const ok = await s.run('cd /work/src && echo z > z.py && cat z.py');
      assert.equal(ok.exitCode, 0, show(ok));
      const bad = await s.run('echo evil >> /work/tests/test_x.py');
      assert.notEqual(bad.exitCode, 0, show(bad));
      assert.match(bad.stderr, DENIED, show(bad));
    } finally {
      await s.close();
    }
  });

  test('it cannot be lifted from inside: the helper is not resident, and running it again only narrows', async () => {
    const ps = await attack(server, sb, 'ps -o pid,args', { writablePaths: RW });
    assert.doesNotMatch(ps.stdout, /dsec-landlock/, `dsec-landlock stayed resident: ${show(ps)}`);
    // Nested: asking the helper itself for a wider set (/) from a confined command adds a layer
    // that cannot widen the first one.
    const widen = await attack(server, sb, ['/dev/.dsec-landlock', '--rw', '/', '--', 'sh', '-c', 'echo evil > /work/tests/test_x.py'], {
      writablePaths: RW,
    });
    assert.notEqual(widen.exitCode, 0, show(widen));
    assert.match(widen.stderr, DENIED, show(widen));
    // And the helper is read-only inside the sandbox.
    const replace = await attack(server, sb, 'cp /bin/busybox /dev/.dsec-landlock');
    assert.notEqual(replace.exitCode, 0, `the helper could be replaced from inside: ${show(replace)}`);
  });

  test('bad input: a writable path that does not exist is a 400 naming it, not a command that fails later', async () => {
    await assert.rejects(
      () => sb.commands.run('true', { writablePaths: ['/no/such/dir'] }),
      (err: unknown) => err instanceof InvalidRequestError && /\/no\/such\/dir/.test(err.message),
    );
    await assert.rejects(
      () => sb.commands.run('true', { writablePaths: ['relative/path'] }),
      (err: unknown) => err instanceof InvalidRequestError,
    );
  });

  test('the bystander is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander);
  });
});
