/**
 * dsec-enter (native/enter-core.c, run by a fork of the edge's dsec-spawn, spawn-enter.c, or as
 * the dsec-enter binary, enter.c): commands start in a container sandbox without `crun exec`, and
 * a command gets exactly what crun exec would give it (the sandbox's namespaces, cgroups, user,
 * capabilities, limits, no_new_privs, seccomp program, Landlock domain, HOME, umask). It refuses a
 * pid that is not the sandbox's init, and the command's environment never appears on a host
 * command line or in a file.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { processBlock } from '../../src/edge/backends/container/oci-config.js';
import { ENTER_BINARY } from '../../src/host/native-helpers.js';
import { SANDBOX_OOM_SCORE_ADJ } from '../../src/host/node-memory.js';
import { runTool } from '../../src/host/run-tool.js';
import { SpawnHelper } from '../../src/host/spawn-helper.js';
import { MNT_DETACH, mount, umount } from '../../src/host/syscalls.js';
import { enterSpec } from '../../src/edge/backends/container/exec/enter-child.js';
import { useServerAndSandbox, type TestServer } from '../helpers/server.js';
import { enterArgvs, enterOptionsOf, hostCrunProcesses, hostExecStarters, pollUntil } from './support/sandbox-procs.js';

/** Extra mounts made in the edge's namespace: ~100 KiB of mount table; dsec-enter's own reads are ~8 KiB. */
const EXTRA_MOUNTS = 1000;

/** What a process is given, from its own /proc: everything crun exec sets up for a command. */
const PROBE = [
  "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status",
  "grep -E '^Max open files' /proc/self/limits",
  'echo umask $(umask)',
  'for n in user mnt pid net ipc uts cgroup; do echo ns $n $(readlink /proc/self/ns/$n); done',
  "grep -v '^0::' /proc/self/cgroup",
  'echo home $HOME',
  'echo cwd $(pwd)',
].join('; ');

/** The host pid of a command that a dsec-enter of the sandbox started and that has exec'd, or ''. */
function runningCommandPid(sandboxId: string): string {
  for (const starter of hostExecStarters(sandboxId)) {
    try {
      for (const child of readFileSync(`/proc/${starter}/task/${starter}/children`, 'utf8').trim().split(' ').filter(Boolean)) {
        if (!isEnter(Number(child))) return child;
      }
    } catch {
      // exited meanwhile
    }
  }
  return '';
}

function isEnter(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]!.endsWith('dsec-enter');
  } catch {
    return false; // exited meanwhile
  }
}

/** A running background command's dsec-enter argv (the command waits for a file that `release` makes). */
async function runningEnter(sb: Sandbox): Promise<{ argv: string[]; release: () => Promise<void> }> {
  const tag = randomBytes(4).toString('hex');
  const p = await sb.commands.start(`while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done`);
  let argv: string[] | undefined;
  assert.ok(await pollUntil(() => (argv = enterArgvs(sb.id)[0]) !== undefined), 'no dsec-enter process for a running command');
  return {
    argv: argv!,
    release: async () => {
      await sb.files.write(`/tmp/go-${tag}`, '');
      await p.wait();
    },
  };
}

describe('engine: commands start through dsec-enter', { timeout: 180_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  useServerAndSandbox({ resources: { memoryMiB: 128 } }, (s, b) => {
    server = s;
    sb = b;
  });

  test('a plain command is started by dsec-enter and no crun runs for it; a terminal still goes through crun exec', async () => {
    const running = await runningEnter(sb);
    assert.deepEqual(
      hostCrunProcesses(sb.id).filter((p) => p.argv.includes('exec')),
      [],
      'no crun exec for a plain command',
    );
    await running.release();
    const t = await sb.terminal({ cmd: ['/bin/sh'], cols: 80, rows: 24, onData: () => {} });
    try {
      assert.ok(await pollUntil(() => hostCrunProcesses(sb.id).some((p) => p.argv.includes('exec'))), 'a terminal is a crun exec');
    } finally {
      t.write('exit\r');
      await t.exited;
    }
  });

  test('a command gets from dsec-enter what crun exec gives it: namespaces, cgroups, user, capabilities, limits, seccomp, HOME, umask', async () => {
    const viaEnter = await sb.commands.run(['/bin/sh', '-c', PROBE]);
    assert.equal(viaEnter.exitCode, 0, viaEnter.stderr);
    // The same command through crun exec, with the process spec dsec gave crun before dsec-enter.
    const running = await runningEnter(sb);
    const sandboxDir = join(enterOptionsOf(running.argv).dir, '..');
    await running.release();
    const specFile = join(sandboxDir, 'run', `probe-${randomBytes(4).toString('hex')}.json`);
    const env = (await sb.commands.run(['/bin/sh', '-c', 'env -0'])).stdout
      .split('\0')
      .filter(
        (kv) => kv && !kv.startsWith('HOME=') && !kv.startsWith('PWD=') && !kv.startsWith('SHLVL=') && !kv.startsWith('DSEC_EXEC_ID='),
      );
    writeFileSync(specFile, JSON.stringify(processBlock({ args: ['/bin/sh', '-c', PROBE], env, cwd: '/', user: { uid: 0, gid: 0 } })));
    const crunRoot = join(server.dataDir, 'node', 'crun');
    const viaCrun = await runTool('crun', ['--root', crunRoot, 'exec', '--process', specFile, sb.id]);
    assert.equal(viaCrun.code, 0, viaCrun.stderr);
    assert.equal(viaEnter.stdout, viaCrun.stdout);
    // The OOM score crun exec would take from its caller (the test here) is set by dsec-spawn.
    assert.equal((await sb.commands.run(['/bin/cat', '/proc/self/oom_score_adj'])).stdout.trim(), String(SANDBOX_OOM_SCORE_ADJ));
    // And what that is: dsec's capabilities, its filter loaded, no way to gain privileges.
    assert.match(viaEnter.stdout, /^Seccomp:\s+2$/m);
    assert.match(viaEnter.stdout, /^Seccomp_filters:\s+1$/m);
    assert.match(viaEnter.stdout, /^NoNewPrivs:\s+1$/m);
    assert.match(viaEnter.stdout, /^CapAmb:\s+0+$/m);
    assert.match(viaEnter.stdout, /^Max open files\s+20000\s+20000/m);
    assert.match(viaEnter.stdout, /^ns mnt mnt:\[\d+\]$/m);
    // (The user namespace is the host's when sandboxes run without one: DSEC_USERNS=false.)
    for (const ns of ['mnt', 'pid', 'net', 'ipc', 'uts', 'cgroup'])
      assert.ok(
        !viaEnter.stdout.includes(`ns ${ns} ${readlinkSync(`/proc/self/ns/${ns}`)}`),
        `the command is in the host's ${ns} namespace`,
      );
  });

  test("dsec-enter waits outside the sandbox's cgroups (not among its processes, not against its pids limit); the command is inside", async () => {
    const running = await runningEnter(sb);
    try {
      let commandPid = '';
      assert.ok(await pollUntil(() => (commandPid = runningCommandPid(sb.id)) !== ''), 'no command process under dsec-enter');
      const starter = Number(readFileSync(`/proc/${commandPid}/stat`, 'utf8').split(') ')[1]!.split(' ')[1]);
      const inSandbox = (pid: number): boolean =>
        readFileSync(`/proc/${pid}/cgroup`, 'utf8')
          .split('\n')
          .some((l) => l.endsWith(`/dsec/${sb.id}`) || l.includes(`/dsec/${sb.id}/`));
      assert.equal(inSandbox(Number(commandPid)), true, 'the command is in the sandbox cgroup');
      assert.equal(inSandbox(starter), false, `its dsec-enter (${starter}) is in the sandbox's cgroups`);
    } finally {
      await running.release();
    }
  });

  test('the command runs in its own command cgroup inside the sandbox cgroup, in every hierarchy crun made for the sandbox', async () => {
    const r = await sb.commands.run(['/bin/cat', '/proc/self/cgroup']);
    const lines = r.stdout.trim().split('\n');
    // Inside its cgroup namespace the sandbox's cgroup is the root: the command's own is below it.
    assert.match(lines.find((l) => l.startsWith('0::')) ?? '', /^0::\/cmd-[0-9a-f]+$/);
    for (const l of lines.filter((x) => !x.startsWith('0::') && /:(memory|pids|cpu[,:])/.test(x)))
      assert.match(l, /:\/$/, `a limiting hierarchy outside the sandbox: ${l}`);
  });

  test('a pid that is not the sandbox init is refused with exit 255 and nothing runs', async () => {
    const running = await runningEnter(sb);
    const { pid: init, cgroup, flags, dir, seccomp } = enterOptionsOf(running.argv);
    const cgroupDirs = flags.slice(flags.indexOf('--cgroup-dir'));
    assert.ok(cgroupDirs.length >= 4, `the sandbox has cgroup dirs: ${flags.join(' ')}`);
    // A process in the sandbox that is not its init: the command (the child of its dsec-enter).
    let commandPid = '';
    assert.ok(await pollUntil(() => (commandPid = runningCommandPid(sb.id)) !== ''), 'no command process under dsec-enter');
    const marker = `/tmp/entered-${randomBytes(4).toString('hex')}`;
    const spec = join(dir, `refused-${randomBytes(4).toString('hex')}.spec`);
    writeFileSync(spec, enterSpec(['/bin/touch', marker], ['PATH=/usr/bin:/bin']), { mode: 0o600 });
    const options = (pid: string, cg: string): string[] => [
      ...['--pid', pid, '--cgroup', cg, '--pid-file', `${spec}.pid`, '--uid', '0', '--gid', '0', '--cwd', '/'],
      ...['--caps', '0', '--nofile', '1024', '--seccomp', seccomp, ...cgroupDirs],
    ];
    const command = { args: ['/bin/touch', marker], env: ['PATH=/usr/bin:/bin'] };
    // Both ways in: the dsec-enter binary, and dsec-spawn's `enter` request (the edge's), one helper of the test's own.
    const binary = (pid: string, cg: string): ReturnType<typeof runTool> => runTool(ENTER_BINARY, [...options(pid, cg), '--spec', spec]);
    const helper = new SpawnHelper();
    const request = (pid: string, cg: string): Promise<{ code: number; stderr: string }> =>
      new Promise((resolve) => {
        const child = helper.enter(options(pid, cg), command, ['null', 'out', 'out']);
        let stderr = '';
        child.stdout!.resume();
        child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
        child.on('error', (err: Error) => resolve({ code: -1, stderr: err.message }));
        child.on('close', (code: number) => resolve({ code, stderr }));
      });
    try {
      for (const enter of [binary, request]) {
        const notInit = await enter(commandPid, cgroup);
        assert.equal(notInit.code, 255, `a sandbox process that is not the init (${commandPid}): ${notInit.stderr}`);
        assert.match(notInit.stderr, /not the sandbox's init/);
        const host = await enter(String(process.pid), cgroup);
        assert.equal(host.code, 255);
        assert.match(host.stderr, /not the sandbox's init|shares this host's/);
        const otherCgroup = await enter(init, `${cgroup}-not-this-one`);
        assert.equal(otherCgroup.code, 255);
        assert.match(otherCgroup.stderr, /not in the sandbox's cgroup/);
        assert.equal(await sb.files.exists(marker), false, 'a refused dsec-enter ran its command');
      }
      // The same calls with the right pid and cgroup do run it (the refusals were not for another reason).
      for (const enter of [binary, request]) {
        const right = await enter(init, cgroup);
        assert.equal(right.code, 0, right.stderr);
        assert.equal(await sb.files.exists(marker), true);
        await sb.files.remove(marker);
      }
    } finally {
      await running.release();
      await helper.close();
    }
  });

  test("dsec-spawn opens a sandbox's files once, at its first command, and closes them when the sandbox ends", async () => {
    // native/spawn-sandboxes.c: the init's pidfd, /dev/null and the sandbox's cgroup.procs in every
    // hierarchy are kept open by the edge's dsec-spawn between commands (no open per command), and
    // dropped when the init exits. Counted in a sandbox of its own, on the edge's own helper.
    const spawner = server.dsec.edge.crun.spawner!;
    // An fd listed may be closed before it is read (the helper serves the next exec's standby
    // meanwhile, exec-standby.ts): one gone is not counted.
    const helperFds = (): string[] =>
      readdirSync(`/proc/${spawner.pid}/fd`).flatMap((fd) => {
        try {
          return [readlinkSync(`/proc/${spawner.pid}/fd/${fd}`)];
        } catch {
          return [];
        }
      });
    const other = await Sandbox.create({ ...server.conn });
    let killed = false;
    try {
      assert.equal((await other.commands.run(['true'])).exitCode, 0);
      const cgroupFiles = (): number => helperFds().filter((f) => f.includes(`/dsec/${other.id}/cgroup.procs`)).length;
      const kept = cgroupFiles();
      assert.ok(kept >= 2, `the sandbox's cgroup files are kept open after its first command (${kept})`);
      const before = helperFds().length;
      for (let i = 0; i < 20; i++) assert.equal((await other.commands.run(['true'])).exitCode, 0);
      assert.equal(cgroupFiles(), kept, 'each command opened its sandbox files again');
      // The last command's pipe ends go when its release is sent, with the next request or alone
      // after 20 ms (516838d): counted once the helper has had it, as the first count may have been.
      assert.ok(
        await pollUntil(() => helperFds().length <= before),
        `dsec-spawn holds more fds after 20 commands: ${helperFds().length} > ${before}`,
      );
      // A command still lands in its own cgroup and the sandbox's (from the kept files).
      assert.match((await other.commands.run(['/bin/cat', '/proc/self/cgroup'])).stdout, /^0::\/cmd-[0-9a-f]+$/m);
      await other.kill();
      killed = true;
      assert.ok(await pollUntil(() => cgroupFiles() === 0), `dsec-spawn still holds ${cgroupFiles()} cgroup files of a killed sandbox`);
    } finally {
      if (!killed) await other.kill();
    }
  });

  test("the command's environment is never on a host command line nor in a file of the edge's", async () => {
    const secret = `s3cret-${randomBytes(8).toString('hex')}`;
    const tag = randomBytes(4).toString('hex');
    const p = await sb.commands.start(`while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done; echo "$TOKEN"`, { env: { TOKEN: secret } });
    let argv: string[] | undefined;
    assert.ok(await pollUntil(() => (argv = enterArgvs(sb.id)[0]) !== undefined));
    const onCommandLines = readdirSync('/proc')
      .filter((e) => /^\d+$/.test(e))
      .filter((e) => {
        try {
          return readFileSync(`/proc/${e}/cmdline`, 'utf8').includes(secret);
        } catch {
          return false;
        }
      });
    assert.deepEqual(onCommandLines, [], 'the secret is on a host command line');
    // It travels in dsec-spawn's pipe: no spec file in the sandbox's scratch dir holds it.
    const { dir } = enterOptionsOf(argv!);
    const inFiles = readdirSync(dir).filter((f) => {
      try {
        return readFileSync(join(dir, f), 'utf8').includes(secret);
      } catch {
        return false; // a directory (the journal)
      }
    });
    assert.deepEqual(inFiles, [], 'the secret is in a file of the edge');
    await sb.files.write(`/tmp/go-${tag}`, '');
    await p.wait();
    assert.equal((await p.output()).stdout, `${secret}\n`);
  });

  test("a command's start does not read the mount table: with a thousand more mounts in the edge's namespace, dsec-enter reads a few KiB", async () => {
    // A full node's edge namespace holds a mount per sandbox; dsec-enter used to read them all
    // (/proc/self/mountinfo) for every command to find the cgroup hierarchies: its cost grew with
    // the sandbox count (docs/RELIABILITY.md, "A full node"). The edge runs in this process.
    const extraDir = join(server.dataDir, 'extra-mounts');
    const mounted: string[] = [];
    try {
      for (let i = 0; i < EXTRA_MOUNTS; i++) {
        const dir = join(extraDir, String(i));
        mkdirSync(dir, { recursive: true });
        mount('extra', dir, 'tmpfs', 0, 'size=64k');
        mounted.push(dir);
      }
      const mountinfoBytes = readFileSync('/proc/self/mountinfo').length;
      const tag = randomBytes(4).toString('hex');
      const p = await sb.commands.start(`while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done`);
      let starter: number | undefined;
      assert.ok(
        await pollUntil(() => (starter = hostExecStarters(sb.id).find((pid) => isEnter(pid))) !== undefined),
        'no dsec-enter process for a running command',
      );
      // Bytes read by dsec-enter up to now (it waits for its command, its reading done).
      const rchar = Number(/^rchar: (\d+)$/m.exec(readFileSync(`/proc/${starter}/io`, 'utf8'))?.[1]);
      await sb.files.write(`/tmp/go-${tag}`, '');
      await p.wait();
      assert.ok(Number.isFinite(rchar));
      assert.ok(rchar < mountinfoBytes / 4, `dsec-enter read ${rchar} bytes; the mount table it would read is ${mountinfoBytes}`);
    } finally {
      for (const dir of mounted.reverse()) umount(dir, MNT_DETACH);
      rmSync(extraDir, { recursive: true, force: true });
    }
  });

  test('a command that cannot start fails with the reason on its stderr', async () => {
    const missing = await sb.commands.run(['/no/such/binary']);
    assert.notEqual(missing.exitCode, 0);
    assert.match(missing.stderr, /no\/such\/binary/);
  });
});
