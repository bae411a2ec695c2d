/**
 * Red team, kernel surface: from inside a sandbox, mount filesystems, make or enter namespaces,
 * set the clock, load modules, kexec or reboot, use bpf/perf/userfaultfd/keyrings/file handles,
 * read kernel addresses and logs, write core_pattern, sysrq or cgroup release agents, and read the
 * host disk through a device node. Each must fail, and the test names what stopped it: the seccomp
 * deny list (EPERM, or ENOSYS for clone3 — and for calls the kernel allows without privilege,
 * the same call on the host as a baseline shows it is seccomp and not the kernel), the dropped
 * capabilities (CapEff), read-only proc/sys/cgroup mounts (EROFS), or the devices cgroup.
 *
 * busybox has no tool for most of these calls, so a tiny static probe binary (assembled by the
 * test, see support/raw-syscall.ts) makes the exact system call and reports the errno. Arguments
 * are chosen so that even a call that got through would change nothing (bad magic, bad flags,
 * NULL pointers, paths that do not exist).
 */
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { CLONE_NAMESPACE_FLAGS, DENIED_SYSCALLS } from '../../src/edge/backends/container/seccomp.js';
import { DEFAULT_CAPABILITIES } from '../../src/edge/backends/container/oci-config.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { CAP, assertBystanderUnaffected, attack, hasCap, must, parseStatus, probeInSandbox, probeOnHost, show } from './support/harness.js';
import { NR, cstr, type Step } from './support/raw-syscall.js';

describe('red team: kernel surface', { skip: integrationSkipReason(), timeout: 900_000 }, () => {
  let server: TestServer;
  let bystander: Sandbox;
  let sb: Sandbox;
  /** /proc/self/status of a command in the sandbox. */
  let status: Map<string, string>;

  /** Runs the probe in the sandbox and asserts the step was refused with `errno`. */
  async function refused(name: string, steps: Step[], errno = 'EPERM'): Promise<void> {
    const out = await probeInSandbox(server, sb, steps);
    assert.equal(out.stepsStarted, steps.length, `${name}: probe did not reach its last step: ${JSON.stringify(out)}`);
    assert.equal(out.error, errno, `${name}: expected ${errno}, the sandbox got ${out.error} (${show(out.raw)})`);
  }

  before(async () => {
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    sb = await Sandbox.create({ ...server.conn, labels: { role: 'attacker' } });
    status = parseStatus((await must(server, sb, 'cat /proc/self/status')).stdout);
  });
  after(async () => {
    await server?.close();
  });

  test('the attacker runs under a seccomp filter, with no_new_privs and without the dangerous capabilities', () => {
    assert.equal(status.get('Seccomp'), '2', `Seccomp mode (2 = filter): ${status.get('Seccomp')}`);
    assert.ok(Number(status.get('Seccomp_filters') ?? 0) >= 1, `Seccomp_filters: ${status.get('Seccomp_filters')}`);
    assert.equal(status.get('NoNewPrivs'), '1');
    const eff = status.get('CapEff') ?? assert.fail('no CapEff');
    const bnd = status.get('CapBnd') ?? assert.fail('no CapBnd');
    for (const [name, bit] of Object.entries(CAP)) {
      if (name === 'CAP_NET_RAW') continue; // in the default set (see the network suite's raw-frame tests)
      assert.equal(hasCap(eff, bit), false, `${name} is effective in the sandbox (CapEff ${eff})`);
      assert.equal(hasCap(bnd, bit), false, `${name} is in the bounding set (CapBnd ${bnd})`);
    }
    assert.equal(status.get('CapAmb'), '0000000000000000');
  });

  test('every way into the sandbox is confined the same: PID 1, background processes, shell sessions and terminals', async () => {
    const check = (where: string, text: string): void => {
      const st = parseStatus(text);
      assert.equal(st.get('Seccomp'), '2', `${where}: Seccomp ${st.get('Seccomp')}`);
      assert.equal(st.get('NoNewPrivs'), '1', `${where}: NoNewPrivs`);
      assert.equal(st.get('CapEff'), status.get('CapEff'), `${where}: CapEff differs from exec`);
      assert.equal(hasCap(st.get('CapBnd') ?? 'f'.repeat(16), CAP.CAP_SYS_ADMIN), false, `${where}: CAP_SYS_ADMIN in the bounding set`);
    };
    check('PID 1 (init)', (await must(server, sb, 'cat /proc/1/status')).stdout);
    const p = await sb.commands.start(['cat', '/proc/self/status']);
    await p.wait({ waitMs: 30_000 });
    check('background process', (await p.output()).stdout);
    const session = await sb.sessions.create();
    check('shell session', (await session.run('cat /proc/self/status')).stdout);
    await session.close();
    let out = '';
    const term = await sb.terminal({ cmd: ['cat', '/proc/self/status'], onData: (d) => (out += Buffer.from(d).toString('utf8')) });
    await term.exited;
    check('terminal', out.replace(/\r/g, ''));
  });

  test('unit: the seccomp deny list names every call these attacks use', () => {
    for (const name of [
      'mount',
      'umount2',
      'pivot_root',
      'fsopen',
      'fsmount',
      'open_tree',
      'move_mount',
      'mount_setattr',
      'unshare',
      'setns',
      'init_module',
      'finit_module',
      'delete_module',
      'kexec_load',
      'kexec_file_load',
      'reboot',
      'bpf',
      'perf_event_open',
      'userfaultfd',
      'keyctl',
      'add_key',
      'request_key',
      'open_by_handle_at',
      'name_to_handle_at',
      'settimeofday',
      'clock_settime',
      'clock_adjtime',
      'adjtimex',
      'swapon',
      'swapoff',
      'syslog',
      'iopl',
      'ioperm',
    ]) {
      assert.ok(name in DENIED_SYSCALLS, `${name} is not in the seccomp deny list`);
    }
    assert.ok(CLONE_NAMESPACE_FLAGS['CLONE_NEWUSER'] !== undefined && CLONE_NAMESPACE_FLAGS['CLONE_NEWNET'] !== undefined);
    for (const cap of [
      'CAP_SYS_ADMIN',
      'CAP_SYS_MODULE',
      'CAP_BPF',
      'CAP_PERFMON',
      'CAP_SYS_BOOT',
      'CAP_SYS_TIME',
      'CAP_SYS_PTRACE',
      'CAP_NET_ADMIN',
      'CAP_SYSLOG',
      'CAP_DAC_READ_SEARCH',
    ]) {
      assert.ok(!DEFAULT_CAPABILITIES.includes(cap), `${cap} is in the default capability set`);
    }
  });

  test('mount a filesystem (mount -t tmpfs, remount, raw mount(2), the new mount API): EPERM', async () => {
    const r = await attack(server, sb, 'mkdir -p /mnt/x && mount -t tmpfs none /mnt/x');
    assert.notEqual(r.exitCode, 0, `mount succeeded: ${show(r)}`);
    // busybox mount reports EPERM as "permission denied (are you root?)"
    assert.match(r.stderr, /permission denied|Operation not permitted/i, show(r));
    const mounts = await must(server, sb, 'cat /proc/self/mounts');
    assert.doesNotMatch(mounts.stdout, /\/mnt\/x/, 'a tmpfs got mounted');
    await refused('mount(2)', [{ nr: NR.mount, args: [cstr('none'), cstr('/mnt/x'), cstr('tmpfs'), 0, 0] }]);
    await refused('fsopen(2)', [{ nr: NR.fsopen, args: [cstr('tmpfs'), 0] }]);
    await refused('open_tree(2)', [{ nr: NR.open_tree, args: [-100, cstr('/'), 1] }]);
  });

  test('create namespaces (unshare -n/-U/-m, clone with CLONE_NEW*, clone3): seccomp refuses, although the kernel allows user namespaces without privilege', async () => {
    for (const flag of ['-n', '-U', '-m', '-p -f', '-u', '-i']) {
      const r = await attack(server, sb, `unshare ${flag} true`);
      assert.notEqual(r.exitCode, 0, `unshare ${flag} succeeded: ${show(r)}`);
      assert.match(r.stderr, /Operation not permitted/, `unshare ${flag}: ${show(r)}`);
    }
    const newUser: Step[] = [{ nr: NR.unshare, args: [CLONE_NAMESPACE_FLAGS['CLONE_NEWUSER']!] }];
    // Baseline: on the host (no seccomp) the kernel lets any process make a user namespace.
    assert.notEqual(probeOnHost(newUser).error, 'EPERM', 'baseline: the host kernel itself refuses unshare(CLONE_NEWUSER)');
    await refused('unshare(CLONE_NEWUSER)', newUser);
    // clone(2) with a namespace flag (SIGCHLD | CLONE_NEWUSER): the flag filter refuses it.
    await refused('clone(CLONE_NEWUSER)', [{ nr: NR.clone, args: [17 | CLONE_NAMESPACE_FLAGS['CLONE_NEWUSER']!, 0, 0, 0, 0] }]);
    await refused('clone(CLONE_NEWNET)', [{ nr: NR.clone, args: [17 | CLONE_NAMESPACE_FLAGS['CLONE_NEWNET']!, 0, 0, 0, 0] }]);
    // clone3 cannot be filtered by flags (they sit in memory): seccomp answers ENOSYS, its signature.
    assert.notEqual(probeOnHost([{ nr: NR.clone3, args: [0, 0] }]).error, 'ENOSYS', 'baseline: the host kernel has no clone3');
    await refused('clone3', [{ nr: NR.clone3, args: [0, 0] }], 'ENOSYS');
  });

  test('enter the host or init namespaces (nsenter -t 1, setns): refused', async () => {
    for (const ns of ['-m', '-n', '-p', '-U']) {
      const r = await attack(server, sb, `nsenter -t 1 ${ns} true`);
      assert.notEqual(r.exitCode, 0, show(r));
      // The command's own Landlock domain refuses opening /proc/1/ns/* (EACCES: init is outside
      // it); were it opened, seccomp would refuse setns (EPERM, checked just below).
      assert.match(r.stderr, /Operation not permitted|can't open '\/proc\/1\/ns\/[a-z]+': Permission denied/, `nsenter ${ns}: ${show(r)}`);
    }
    // /proc/1 is the sandbox's own init: even a working setns would not reach the host.
    const init = await must(server, sb, 'tr "\\0" " " < /proc/1/cmdline');
    assert.match(init.stdout, /\.dsec-init/);
    await refused('setns', [{ nr: NR.setns, args: [0, 0] }]);
  });

  test('set the host clock (date -s, hwclock, settimeofday): EPERM; the host clock did not move', async () => {
    const t0 = Date.now();
    const r = await attack(server, sb, 'date -s "2001-01-01 00:00:00"');
    // busybox date prints the date it meant to set and exits 0; the refusal is on stderr.
    assert.match(r.stderr, /can't set date: Operation not permitted/, show(r));
    await refused('settimeofday(NULL, NULL)', [{ nr: NR.settimeofday, args: [0, 0] }]);
    // hwclock: no RTC device; a planted one is refused by the devices cgroup (in a user namespace,
    // DSEC_USERNS, the mknod itself is refused, so there is no node to open).
    const hw = await attack(server, sb, 'mknod /tmp/rtc0 c 252 0 2>/dev/null; hwclock -f /tmp/rtc0 -r');
    assert.notEqual(hw.exitCode, 0, show(hw));
    assert.match(hw.stderr, /Operation not permitted|No such device|No such file/, show(hw));
    const t1 = Date.now();
    assert.ok(t1 >= t0 && t1 - t0 < 3600_000, `the host clock moved: ${new Date(t0).toISOString()} → ${new Date(t1).toISOString()}`);
    assert.ok(new Date(t1).getUTCFullYear() > 2001);
  });

  test('swapoff / swapon: EPERM', async () => {
    const r = await attack(server, sb, 'touch /swapf && swapoff /swapf');
    assert.notEqual(r.exitCode, 0, show(r));
    assert.match(r.stderr, /Operation not permitted/, show(r));
    await refused('swapoff(2)', [{ nr: NR.swapoff, args: [cstr('/nonexistent')] }]);
  });

  test('load a kernel module (insmod, modprobe, init_module, finit_module): EPERM, and no CAP_SYS_MODULE', async () => {
    await sb.files.write('/tmp/evil.ko', Buffer.concat([Buffer.from('\x7fELF'), Buffer.alloc(256, 0x41)]));
    const ins = await attack(server, sb, 'insmod /tmp/evil.ko');
    assert.notEqual(ins.exitCode, 0, show(ins));
    assert.match(ins.stderr, /Operation not permitted/, `insmod: ${show(ins)}`);
    const mp = await attack(
      server,
      sb,
      'mkdir -p /lib/modules/$(uname -r) && cp /tmp/evil.ko /lib/modules/$(uname -r)/evil.ko && depmod 2>/dev/null; modprobe evil',
    );
    assert.notEqual(mp.exitCode, 0, show(mp));
    assert.equal(hasCap(status.get('CapEff')!, CAP.CAP_SYS_MODULE), false);
    await refused('init_module', [{ nr: NR.init_module, args: [Buffer.alloc(64), 64, cstr('')] }]);
    // Baseline: on the host, finit_module on a bad fd fails with EBADF (ENOSYS on a kernel built
    // without modules): EPERM inside the sandbox is the seccomp filter.
    const finit: Step[] = [{ nr: NR.finit_module, args: [-1, cstr(''), 0] }];
    assert.notEqual(probeOnHost(finit).error, 'EPERM', 'baseline: the host refuses finit_module with EPERM by itself');
    await refused('finit_module', finit);
    const lsmod = await attack(server, sb, 'cat /proc/modules 2>/dev/null | grep -c "^evil "');
    assert.equal(lsmod.stdout.trim(), '0', `a module named evil is loaded: ${show(lsmod)}`);
  });

  test('kexec a new kernel or reboot the host (kexec_load, kexec_file_load, reboot): EPERM', async () => {
    // Invalid flags / magic: nothing would happen even if the call got through.
    await refused('kexec_load', [{ nr: NR.kexec_load, args: [0, 0, 0, 0xdead0000] }]);
    await refused('kexec_file_load', [{ nr: NR.kexec_file_load, args: [-1, -1, 0, 0, 0xdead0000] }]);
    await refused('reboot', [{ nr: NR.reboot, args: [0, 0, 0, 0] }]);
    assert.equal(hasCap(status.get('CapEff')!, CAP.CAP_SYS_BOOT), false, 'CAP_SYS_BOOT is effective');
    await must(server, sb, 'true'); // the sandbox is still there
  });

  test('bpf(), perf_event_open, userfaultfd, keyrings, file handles, ptrace, process_vm_*, pidfd_getfd, kcmp and io_uring: seccomp refuses them (the host kernel allows several without privilege)', async () => {
    const calls: { name: string; steps: Step[]; hostAllows?: boolean }[] = [
      { name: 'bpf(BPF_PROG_LOAD)', steps: [{ nr: NR.bpf, args: [5, 0, 0] }] },
      { name: 'bpf(BPF_MAP_CREATE)', steps: [{ nr: NR.bpf, args: [0, 0, 0] }] },
      { name: 'perf_event_open', steps: [{ nr: NR.perf_event_open, args: [0, 0, -1, -1, 0] }] },
      { name: 'userfaultfd(UFFD_USER_MODE_ONLY)', steps: [{ nr: NR.userfaultfd, args: [1] }], hostAllows: true },
      { name: 'keyctl(GET_KEYRING_ID, session)', steps: [{ nr: NR.keyctl, args: [0, -3, 0] }], hostAllows: true },
      { name: 'add_key(user)', steps: [{ nr: NR.add_key, args: [cstr('user'), cstr('dsec-redteam'), Buffer.from('x'), 1, -3] }] },
      {
        name: 'name_to_handle_at',
        steps: [{ nr: NR.name_to_handle_at, args: [-100, cstr('/'), Buffer.alloc(136), Buffer.alloc(8), 0] }],
        hostAllows: true,
      },
      { name: 'open_by_handle_at ("shocker")', steps: [{ nr: NR.open_by_handle_at, args: [-100, 0, 0] }] },
      // Reaching into other processes (issue 10's forged session results): the host answers
      // ESRCH/EBADF for these made-up pids and fds; inside, seccomp refuses first.
      { name: 'ptrace(PTRACE_PEEKUSER, no such pid)', steps: [{ nr: NR.ptrace, args: [3, 0x3ffffff0, 0, 0] }], hostAllows: true },
      { name: 'process_vm_readv', steps: [{ nr: NR.process_vm_readv, args: [0x3ffffff0, 0, 0, 0, 0, 0] }], hostAllows: true },
      { name: 'process_vm_writev', steps: [{ nr: NR.process_vm_writev, args: [0x3ffffff0, 0, 0, 0, 0, 0] }], hostAllows: true },
      { name: 'pidfd_getfd(bad pidfd)', steps: [{ nr: NR.pidfd_getfd, args: [-1, 0, 0] }], hostAllows: true },
      { name: 'kcmp', steps: [{ nr: NR.kcmp, args: [0x3ffffff0, 0x3ffffff0, 0, 0, 0] }], hostAllows: true },
      { name: 'io_uring_setup', steps: [{ nr: NR.io_uring_setup, args: [1, Buffer.alloc(120)] }], hostAllows: true },
    ];
    for (const c of calls) {
      if (c.hostAllows) {
        // Baseline: the kernel answers this without EPERM outside the sandbox, so EPERM inside is seccomp.
        assert.notEqual(probeOnHost(c.steps).error, 'EPERM', `baseline: the host refuses ${c.name} with EPERM by itself`);
      }
      await refused(c.name, c.steps);
    }
    assert.equal(hasCap(status.get('CapEff')!, CAP.CAP_BPF), false, 'CAP_BPF (39) is effective');
    assert.equal(hasCap(status.get('CapEff')!, CAP.CAP_PERFMON), false, 'CAP_PERFMON (38) is effective');
    assert.equal(hasCap(status.get('CapEff')!, CAP.CAP_SYS_ADMIN), false, 'CAP_SYS_ADMIN (21) is effective');
  });

  test('read kernel addresses and the kernel log (/proc/kallsyms, dmesg): zeroed addresses; syslog refused', async () => {
    const k = await attack(server, sb, 'head -n 200 /proc/kallsyms');
    if (k.exitCode === 0 && k.stdout.length > 0) {
      const nonZero = k.stdout.split('\n').filter((l) => l && !/^0{16} /.test(l));
      assert.deepEqual(nonZero.slice(0, 5), [], 'kernel symbol addresses are visible from the sandbox');
    }
    const d = await attack(server, sb, 'dmesg');
    assert.notEqual(d.exitCode, 0, `dmesg worked: ${show(d)}`);
    assert.match(d.stderr, /Operation not permitted/, show(d));
    const kcore = await attack(server, sb, 'head -c 16 /proc/kcore | od -An -tx1');
    assert.equal(kcore.stdout.trim(), '', `/proc/kcore is readable: ${show(kcore)}`);
  });

  test('host-wide kernel knobs: core_pattern, sysrq-trigger, /proc/sys writes fail (read-only mounts)', async () => {
    // Opened for writing with nothing written: harmless even if the open succeeded.
    const core = await attack(server, sb, ': >> /proc/sys/kernel/core_pattern');
    assert.notEqual(core.exitCode, 0, `core_pattern is writable: ${show(core)}`);
    // Under DSEC_USERNS the file is not the sandbox root's: the kernel answers EACCES before EROFS.
    assert.match(core.stderr, /Read-only file system|Permission denied/, show(core));
    const sysrq = await attack(server, sb, ': >> /proc/sysrq-trigger');
    assert.notEqual(sysrq.exitCode, 0, `sysrq-trigger is writable: ${show(sysrq)}`);
    assert.match(sysrq.stderr, /Read-only file system|nonexistent directory|Permission denied|No such file/, show(sysrq));
    const sysctl = await attack(server, sb, 'cat /proc/sys/kernel/hostname > /tmp/h && cat /tmp/h >> /proc/sys/kernel/hostname');
    assert.match(sysctl.stderr, /Read-only file system|Permission denied/, show(sysctl));
    const sysfs = await attack(server, sb, ': >> /sys/kernel/uevent_helper');
    assert.notEqual(sysfs.exitCode, 0, `/sys/kernel/uevent_helper is writable: ${show(sysfs)}`);
    assert.match(sysfs.stderr, /Read-only file system|No such file|nonexistent/, show(sysfs));
  });

  test('cgroup escape (notify_on_release / release_agent, new cgroup mount): read-only cgroupfs, mount refused', async () => {
    const notify = await attack(server, sb, ': >> /sys/fs/cgroup/memory/notify_on_release');
    assert.notEqual(notify.exitCode, 0, show(notify));
    assert.match(notify.stderr, /Read-only file system|Permission denied/, show(notify));
    const mk = await attack(server, sb, 'mkdir /sys/fs/cgroup/memory/x');
    assert.notEqual(mk.exitCode, 0, show(mk));
    assert.match(mk.stderr, /Read-only file system|Permission denied/, show(mk));
    const m = await attack(server, sb, 'mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg');
    assert.notEqual(m.exitCode, 0, show(m));
    assert.match(m.stderr, /permission denied|Operation not permitted/i, show(m));
    // The cgroup namespace: the sandbox sees its own cgroup as the root (on cgroup2, a command
    // sits in its own command cgroup just below it: host/command-cgroups.ts).
    const self = await must(server, sb, 'cat /proc/self/cgroup');
    for (const line of self.stdout.trim().split('\n')) {
      assert.match(line, line.startsWith('0::') ? /^0::\/(cmd-[0-9a-f]+)?$/ : /:\/$/, `cgroup path leaks the host hierarchy: ${line}`);
    }
  });

  test('read the host disk or memory through a planted device node (mknod): refused by the devices cgroup', async () => {
    const disk = statSync('/').dev;
    const major = Math.floor(disk / 256) & 0xfff;
    const minor = (disk & 0xff) | ((disk >> 12) & 0xfff00);
    for (const [name, node] of [
      ['the host root disk', `b ${major} ${minor}`],
      ['/dev/mem', 'c 1 1'],
      ['/dev/kmsg', 'c 1 11'],
      ['/dev/sda', 'b 8 0'],
      ['/dev/vda', 'b 254 0'],
    ] as const) {
      const r = await attack(server, sb, `rm -f /tmp/dev; mknod /tmp/dev ${node} && head -c 512 /tmp/dev | od -An -tx1 | head -2`);
      // A block node is not even made (each command's Landlock domain refuses it: EACCES); a
      // character node is made and the devices cgroup refuses opening it (EPERM).
      const expected = node.startsWith('b ') ? /mknod: \/tmp\/dev: Permission denied/ : /Operation not permitted/;
      assert.match(r.stderr, expected, `${name} (${node}): ${show(r)}`);
      assert.equal(r.stdout.trim(), '', `${name} (${node}) was readable: ${show(r)}`);
    }
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander);
  });
});
