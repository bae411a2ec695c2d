import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { isQemuOf, VmPaths } from './qemu-launch.js';

/** The command line of pid as NUL-joined text ('' when gone). */
function cmdlineOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
}

describe('isQemuOf', () => {
  const paths = new VmPaths('/var/tmp/dsec-no-such-vm-dir');

  test('a just-launched pid counts as the VM through the execs on its way (sh → sh → the program)', async () => {
    // The launch's shape without QEMU: a shell that execs another shell that execs the program,
    // whose argv names the agent socket as QEMU's does. Polled as fast as the edge's boot loop
    // can, the pid must never read as dead until the program runs. Each exec's window is a
    // fraction of a millisecond, so the launch is repeated until the polls have met one.
    // The program is a shell blocked reading its stdin, with the socket as its $0.
    const program = ['sh', '-c', 'read line', paths.agentSocket];
    let windows = 0;
    for (let launch = 0; launch < 200 && windows < 3; launch++) {
      const child = spawn('sh', ['-c', 'exec "$@"', 'sh', 'sh', '-c', 'exec "$@"', 'sh', ...program], {
        stdio: ['pipe', 'ignore', 'ignore'],
      });
      const pid = child.pid!;
      try {
        for (let polls = 1; ; polls++) {
          const cmd = cmdlineOf(pid);
          const alive = isQemuOf(pid, paths);
          if (cmd === '' && alive) windows++;
          assert.ok(alive, `launch ${launch}: pid ${pid} read as gone after ${polls} polls, cmdline ${JSON.stringify(cmd)}`);
          if (cmd === `${program.join('\0')}\0`) break;
        }
        assert.equal(isQemuOf(pid, paths, { adopting: true }), true, 'the program itself is recognised when adopting too');
      } finally {
        child.kill('SIGKILL');
        await new Promise((resolve) => child.once('exit', resolve));
      }
      assert.equal(isQemuOf(pid, paths), false, 'a reaped pid is not the VM');
    }
    assert.ok(windows > 0, 'the polls never met an exec in progress: the test proved nothing');
  });

  test("another program's pid, a zombie and a kernel thread are not the VM", async () => {
    assert.equal(isQemuOf(process.pid, paths), false, 'a command line without the socket');
    assert.equal(isQemuOf(2, paths), false, 'kthreadd: an empty command line, but a kernel thread');
    // A zombie: a child that exits once its parent has become `sleep`, which never reaps it.
    const parent = spawn('sh', ['-c', `sh -c 'sleep 0.2' "${paths.agentSocket}" & echo $!; exec sleep 5`], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    try {
      const zombie = Number(await new Promise<string>((resolve) => parent.stdout.once('data', (d: Buffer) => resolve(d.toString()))));
      while (!/\) Z /.test(readFileSync(`/proc/${zombie}/stat`, 'utf8'))) await new Promise((r) => setTimeout(r, 10));
      assert.equal(isQemuOf(zombie, paths), false);
    } finally {
      parent.kill('SIGKILL');
    }
  });
});
