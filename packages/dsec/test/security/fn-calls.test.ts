/**
 * Red team for function calls: what one call tries against the worker it runs in and against the
 * calls after it. Calls of one kind run one at a time on the same warm worker here, so a later
 * call meets whatever an earlier one left, unless the worker was replaced. Each attack is run for
 * real in a real worker (crun, Landlock, cgroups); the assertions are on what the next call sees.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { DsecError, fn } from '@dsec/sdk';
import type { FnRunRequest, FnRunResult } from '@dsec/sdk/schema';
import { buildFnRuntimeImage } from '../../src/image/builders/fn-runtime.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const skip =
  integrationSkipReason() ??
  (existsSync('/usr/bin/python3') ? undefined : 'fn calls need /usr/bin/python3 on the host (the fn-runtime image copies it)');

/** Polls until a worker's sandbox is gone from the host (its retirement is asynchronous). */
async function gone(worker: string): Promise<void> {
  while (existsSync(`/sys/fs/cgroup/pids/dsec/${worker}`) || existsSync(`/sys/fs/cgroup/dsec/${worker}`))
    await new Promise((r) => setTimeout(r, 20));
}

describe('red team: function calls', { skip, timeout: 300_000 }, () => {
  let server: TestServer;
  let run: (call: FnRunRequest) => Promise<FnRunResult>;
  before(async () => {
    server = await startTestServer();
    await buildFnRuntimeImage(server.dsec.images);
    run = async (call) => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await fn.run(call, server.conn);
        } catch (err) {
          // This file's OOMs thrash the node on purpose, and on a small shared host the node's
          // admission then refuses creates until PSI's 10 s average falls: retry, as a client of
          // that 503 would (a full run failed here once with PSI full avg10 at 40.8 %).
          if (!(err instanceof DsecError && err.code === 'NODE_MEMORY_PRESSURE') || attempt >= 60) throw err;
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    };
  });
  after(async () => server?.close());

  test("a call cannot read an earlier call's files, shared memory or environment, nor write outside its scratch", async () => {
    const kind = { memoryMiB: 96 };
    const a = await run({
      ...kind,
      runtime: 'python',
      env: { CALL_SECRET: 'sekrit-a' },
      code: [
        'import os',
        'open("left.txt", "w").write("sekrit-a")',
        'open("/tmp/also.txt", "w").write("sekrit-a")',
        'open("/dev/shm/shm.txt", "w").write("sekrit-a")',
        'for p in ["/etc/planted", "/root/planted", "/var/tmp/planted", "/usr/bin/planted", "/planted"]:',
        '    try:',
        '        open(p, "w").write("x")',
        '        print("WROTE", p)',
        '    except OSError as e:',
        '        print("denied", p, e.errno)',
      ].join('\n'),
    });
    assert.equal(a.exitCode, 0, a.stderr);
    assert.doesNotMatch(a.stdout, /WROTE/, 'every write outside the scratch dirs is refused');
    assert.equal(a.workerReplaced, false, a.replacedBecause);
    const b = await run({
      ...kind,
      runtime: 'python',
      code: [
        'import os, glob',
        'found = []',
        'needle = b"sekrit" + b"-a"  # not the literal: this program\'s own main.py must not match',
        'for root in ["/tmp", "/dev/shm", "/dev/mqueue", "/etc", "/root", "/var", "/home", "/run"]:',
        '    for dirpath, dirs, files in os.walk(root):',
        '        for f in files:',
        '            p = os.path.join(dirpath, f)',
        '            try:',
        '                if needle in open(p, "rb").read(1 << 16): found.append(p)',
        '            except OSError: pass',
        'for p in glob.glob("/proc/[0-9]*/environ"):',
        '    try:',
        '        if needle in open(p, "rb").read(): found.append(p)',
        '    except OSError: pass',
        'print("found", found)',
        'print(sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")))',
      ].join('\n'),
      timeoutMs: 60_000,
    });
    assert.equal(b.worker, a.worker, 'the second call ran in the same worker');
    assert.equal(b.exitCode, 0, b.stderr);
    assert.match(b.stdout, /^found \[\]\n\['call'\] \[\]\n$/, b.stdout);
  });

  test('a process a call leaves behind outside its session (setsid) takes the worker with it; the next call gets a fresh one', async () => {
    const kind = { memoryMiB: 104 };
    const first = await run({ ...kind, runtime: 'python', code: 'print("warm")' });
    const left = await run({
      ...kind,
      runtime: 'python',
      code: 'import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)\nprint("parent done")',
    });
    assert.equal(left.worker, first.worker);
    assert.equal(left.exitCode, 0, left.stderr);
    assert.equal(left.workerReplaced, true);
    assert.match(left.replacedBecause ?? '', /left 1 process/);
    const next = await run({ ...kind, runtime: 'bash', code: 'ls /proc | grep -c "^[0-9]"' });
    assert.notEqual(next.worker, left.worker, 'the damaged worker was not reused');
    await gone(left.worker);
    // bash too: a background job detached with setsid.
    const sh = await run({ ...kind, runtime: 'bash', code: '(setsid sleep 1000 &) ; echo started' });
    assert.equal(sh.workerReplaced, true, 'setsid sleep outlived the call');
    await gone(sh.worker);
  });

  test('a leftover whose main thread left with the raw exit syscall (a zombie leader, a live thread) still takes the worker with it', async () => {
    // Red team round three, second pass: /proc/<pid>/stat of such a process says Z, and the check
    // took it for gone; its thread lived on into every later call and rewrote their code.
    const kind = { memoryMiB: 104 };
    const first = await run({ ...kind, runtime: 'python', code: 'print("warm")' });
    const ghost = await run({
      ...kind,
      runtime: 'python',
      code: [
        'import ctypes, os, threading, time',
        'if os.fork() == 0:',
        '    os.setsid()',
        '    if os.fork() == 0:',
        '        threading.Thread(target=lambda: time.sleep(1000)).start()',
        '        time.sleep(0.2)',
        '        ctypes.CDLL(None).syscall(60, 0)  # exit(2): this thread only',
        '    os._exit(0)',
        'time.sleep(0.5)',
        'print("parent done")',
      ].join('\n'),
    });
    assert.equal(ghost.worker, first.worker);
    assert.equal(ghost.exitCode, 0, ghost.stderr);
    assert.equal(ghost.workerReplaced, true, `a zombie leader with a live thread outlived the call: ${JSON.stringify(ghost)}`);
    assert.match(ghost.replacedBecause ?? '', /left 1 process/);
    await gone(ghost.worker);
  });

  test('a leftover that writes into the scratch dirs just after the call and then exits leaves nothing for the next call', async () => {
    // Red team round three, second pass: the fork server wiped the scratch dirs as soon as the
    // leader ended; a setsid'd leftover wrote after that and exited within the edge's settle
    // window, unseen. The fork server now ends every leftover before it wipes.
    const kind = { memoryMiB: 104 };
    const first = await run({ ...kind, runtime: 'python', code: 'print("warm")' });
    const plant = await run({
      ...kind,
      runtime: 'python',
      code: [
        'import os, time',
        "open('/tmp/marker', 'w').write('m')",
        'if os.fork() == 0:',
        '    os.setsid()',
        '    if os.fork() == 0:',
        '        # Wait for the wipe (the marker goes with it), then plant and leave at once.',
        '        t = time.monotonic()',
        "        while os.path.exists('/tmp/marker') and time.monotonic() - t < 5:",
        '            time.sleep(0.0005)',
        "        open('/tmp/planted', 'w').write('x')",
        "        os.makedirs('/tmp/node_modules/fs', exist_ok=True)",
        '        os._exit(0)',
        '    os._exit(0)',
        'print("parent done")',
      ].join('\n'),
    });
    assert.equal(plant.worker, first.worker);
    assert.equal(plant.exitCode, 0, plant.stderr);
    const next = await run({
      ...kind,
      runtime: 'python',
      code: "import os; print(os.path.exists('/tmp/planted'), os.path.exists('/tmp/node_modules'))",
    });
    assert.equal(
      next.stdout.trim(),
      'False False',
      `the next call (worker ${next.worker}, the planter's ${plant.worker}) met the leftover's files`,
    );
  });

  test("a background job in the call's own session is killed with it; the worker stays and the next call sees no trace", async () => {
    const kind = { memoryMiB: 112 };
    const bg = await run({ ...kind, runtime: 'bash', code: 'sleep 1000 & echo $!' });
    assert.equal(bg.exitCode, 0, bg.stderr);
    assert.equal(bg.workerReplaced, false, bg.replacedBecause);
    const next = await run({
      ...kind,
      runtime: 'bash',
      code: 'for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | sort | tr "\\n" " "',
    });
    assert.equal(next.worker, bg.worker);
    assert.doesNotMatch(next.stdout, /sleep/, next.stdout);
  });

  test('the fork server and the call leader are out of reach: no /proc fd, environ or mem, no ptrace', async () => {
    const r = await run({
      runtime: 'python',
      code: [
        'import os, ctypes',
        'leader = os.getppid()',
        'zygote = int(open(f"/proc/{leader}/stat").read().rsplit(")", 1)[1].split()[1])',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'for pid, name in ((zygote, "zygote"), (leader, "leader")):',
        '    for what in ("environ", "mem", "fd/0", "fd/3"):',
        '        try:',
        '            open(f"/proc/{pid}/{what}", "rb").read(1)',
        '            print("READ", name, what)',
        '        except OSError as e:',
        '            print("denied", name, what)',
        '    print("ptrace", name, libc.ptrace(16, pid, 0, 0))',
      ].join('\n'),
    });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /READ/, r.stdout);
    assert.match(r.stdout, /ptrace zygote -1\n/);
    assert.match(r.stdout, /ptrace leader -1\n/);
  });

  test('escape attempts fail: mount, a user namespace, sysrq, kernel memory; no network unless asked', async () => {
    const r = await run({
      runtime: 'python',
      code: [
        'import ctypes, os',
        'libc = ctypes.CDLL(None, use_errno=True)',
        'print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))',
        'print("unshare", libc.unshare(0x10000000))',
        'for p in ("/proc/sysrq-trigger", "/proc/kcore", "/sys/kernel/notes"):',
        '    try:',
        '        open(p, "wb").write(b"x")',
        '        print("WROTE", p)',
        '    except OSError: pass',
        'print("ifaces", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))',
      ].join('\n'),
    });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /^mount -1\nunshare -1\nifaces \['lo'\]\n$/, r.stdout);
  });

  test('SysV shared memory, message queues and semaphores and POSIX queues do not reach the next call on the same worker', async () => {
    const kind = { memoryMiB: 136 };
    const libc = ['import ctypes, os, struct, sys', 'libc = ctypes.CDLL(None, use_errno=True)', 'libc.shmat.restype = ctypes.c_void_p'];
    const make = (key: number): string[] => [
      `shm = libc.shmget(${key}, 4096, 0o1600)`, // IPC_CREAT | 0600
      'p = libc.shmat(shm, None, 0)',
      'ctypes.memmove(p, b"sekrit-a", 8)',
      'libc.shmdt(ctypes.c_void_p(p))',
      `msg = libc.msgget(${key + 1}, 0o1600)`,
      'buf = ctypes.create_string_buffer(struct.pack("l", 1) + b"sekrit-a")',
      'sent = libc.msgsnd(msg, buf, 8, 0)',
      `sem = libc.semget(${key + 2}, 1, 0o1600)`,
      'print("made", shm >= 0, p not in (None, 2**64 - 1), msg >= 0, sent == 0, sem >= 0)',
    ];
    const look = [
      ...libc,
      'seen = {k: [l.split()[:2] for l in open("/proc/sysvipc/" + k).readlines()[1:]] for k in ("shm", "msg", "sem")}',
      'print("seen", seen["shm"], seen["msg"], seen["sem"], sorted(os.listdir("/dev/mqueue")))',
      'print("by key", libc.shmget(0x5eed, 0, 0), libc.msgget(0x5eee, 0), libc.semget(0x5eef, 0, 0))',
    ].join('\n');
    const made = await run({
      ...kind,
      runtime: 'python',
      code: [...libc, ...make(0x5eed), 'print("mq", libc.mq_open(b"/dsec-left", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0)'].join('\n'),
    });
    assert.equal(made.stdout, 'made True True True True True\nmq True\n', made.stderr);
    const next = await run({ ...kind, runtime: 'python', code: look });
    assert.equal(next.worker, made.worker, `the next call ran on the same worker (replaced because: ${made.replacedBecause})`);
    assert.equal(next.stdout, 'seen [] [] [] []\nby key -1 -1 -1\n', next.stdout);
    assert.equal(made.workerReplaced, false, 'removing what the call left is enough: the worker stays');

    // Every runtime: bash (its python3 child makes them) and node see nothing from before either.
    const sh = await run({
      ...kind,
      runtime: 'bash',
      code: `cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | grep -vc key; python3 -c '${[...libc, ...make(0x5eed)].join('\n')}'`,
    });
    assert.equal(sh.worker, made.worker);
    assert.equal(sh.stdout, '0\nmade True True True True True\n', sh.stderr);
    const js = await run({
      ...kind,
      runtime: 'node',
      code: 'const fs = require("fs"); for (const k of ["shm", "msg", "sem"]) console.log(k, fs.readFileSync("/proc/sysvipc/" + k, "utf8").trim().split("\\n").length - 1)',
    });
    assert.equal(js.worker, made.worker);
    assert.equal(js.stdout, 'shm 0\nmsg 0\nsem 0\n', js.stderr);

    // Objects the fork server may not remove (made under another uid: only their creator or owner
    // may) take the worker with them.
    const other = await run({
      ...kind,
      runtime: 'python',
      code: [
        ...libc,
        'if os.fork() == 0:',
        '    os.setgid(1000); os.setuid(1000)',
        ...make(0x6eed).map((l) => `    ${l}`),
        '    sys.stdout.flush()',
        '    os._exit(0)',
        'os.wait()',
      ].join('\n'),
    });
    assert.equal(other.stdout, 'made True True True True True\n', other.stderr);
    const fresh = await run({ ...kind, runtime: 'python', code: look });
    assert.equal(fresh.stdout, 'seen [] [] [] []\nby key -1 -1 -1\n', fresh.stdout);
    assert.equal(other.workerReplaced, true, 'objects of another uid replace the worker');
    assert.match(other.replacedBecause ?? '', /SysV IPC/);
    assert.notEqual(fresh.worker, other.worker);
    await gone(other.worker);
  });

  test('chmod, chown, utimes and xattrs outside the scratch dirs replace the worker: the next call sees the original metadata', async () => {
    const kind = { memoryMiB: 144 };
    // Files of the image (copied up by the change), the root and /tmp (already in the worker's
    // upper: changed in place), /dev (the container's tmpfs). Never a host device such as /dev/null.
    const look = [
      'import os, shutil, json',
      'for p in (os.__file__, shutil.__file__, json.__file__, "/etc/passwd", "/", "/dev", "/tmp"):',
      '    st = os.lstat(p)',
      // The root, /dev and /tmp are each worker's own (made with it): only a planted mtime counts there.
      '    mtime = st.st_mtime_ns if p.startswith(("/usr", "/etc")) else ("planted" if st.st_mtime_ns == 86400 * 10**9 else "-")',
      '    print(p, oct(st.st_mode), st.st_uid, st.st_gid, mtime, sorted(os.listxattr(p, follow_symlinks=False)))',
    ].join('\n');
    const before = await run({ ...kind, runtime: 'python', code: look });
    assert.equal(before.exitCode, 0, before.stderr);
    const attacks: [FnRunRequest['runtime'], string][] = [
      ['python', 'import os\nos.chmod(os.__file__, 0o600)'],
      ['python', 'import os\nos.chown(os.__file__, 1, 1)'],
      ['python', 'import os, shutil\nos.utime(shutil.__file__, (86400, 86400))'],
      ['python', 'import os, json\nos.setxattr(json.__file__, "user.planted", b"1")'],
      ['python', 'import os\nos.chmod("/", 0o700)'],
      ['python', 'import os\nos.utime("/dev", (86400, 86400))'],
      ['python', 'import os\nos.setxattr("/tmp", "user.planted", b"1")\nos.chmod("/tmp", 0o700)'],
      ['bash', 'chmod 600 /etc/passwd'],
      ['node', 'require("fs").utimesSync("/etc/passwd", 86400, 86400)'],
    ];
    for (const [runtime, code] of attacks) {
      const attack = await run({
        ...kind,
        runtime,
        code: `${code}\n${runtime === 'bash' ? 'echo ok' : runtime === 'node' ? 'console.log("ok")' : 'print("ok")'}`,
      });
      assert.equal(attack.stdout, 'ok\n', `${code}: ${attack.stderr}`);
      const after = await run({ ...kind, runtime: 'python', code: look });
      assert.equal(after.stdout, before.stdout, `after ${code} (${attack.worker === after.worker ? 'same' : 'another'} worker)`);
      assert.equal(attack.workerReplaced, true, `${code} left the worker in service`);
      assert.match(attack.replacedBecause ?? '', /changed the mode, owner, times or xattrs of/);
      assert.notEqual(after.worker, attack.worker);
    }
    // Reading files outside the scratch dirs, using /dev's devices and a pty, and making, changing
    // and removing files in the scratch dirs change nothing.
    const quiet = await run({
      ...kind,
      runtime: 'python',
      code: [
        'import os, pty',
        'open(os.__file__).read(); open("/dev/null", "w").write("x"); open("/dev/urandom", "rb").read(8)',
        'm, s = pty.openpty(); os.write(s, b"x"); os.read(m, 1)',
        'os.mkdir("/tmp/d"); os.utime("/tmp/d", (1, 1)); open("/dev/shm/x", "w").write("x"); os.chmod("/dev/shm/x", 0o600)',
        'print("ok")',
      ].join('\n'),
    });
    assert.equal(quiet.stdout, 'ok\n', quiet.stderr);
    assert.equal(quiet.workerReplaced, false, quiet.replacedBecause);
    // Nor does another sandbox starting on the node (crun changes the owner of the host's device
    // nodes a user-namespaced sandbox binds, /dev/null, as it starts one: not the call's doing).
    await run({ memoryMiB: 152, runtime: 'python', code: 'print("another worker")' });
    const later = await run({ ...kind, runtime: 'python', code: 'print("ok")' });
    assert.equal(later.worker, quiet.worker);
    assert.equal(later.workerReplaced, false, later.replacedBecause);
  });

  test('exhausting the worker: OOM replaces it; a fork bomb and a full disk leave nothing for the next call', async () => {
    const oom = await run({ memoryMiB: 64, runtime: 'python', code: 'x = bytearray(400 << 20)\nprint("survived")' });
    assert.equal(oom.oomKilled, true, JSON.stringify(oom));
    assert.equal(oom.workerReplaced, true);
    const after = await run({ memoryMiB: 64, runtime: 'python', code: 'print("fine")' });
    assert.equal(after.stdout, 'fine\n');
    assert.notEqual(after.worker, oom.worker);

    const kind = { memoryMiB: 120 };
    const bomb = await run({
      ...kind,
      runtime: 'python',
      timeoutMs: 1500,
      code: 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass',
    });
    // Python forks are heavy: the bomb meets the memory limit (the worker is replaced) or the pids limit (its session is killed at the deadline).
    assert.ok(bomb.timedOut || (bomb.oomKilled && bomb.workerReplaced), JSON.stringify(bomb));
    const calm = await run({ ...kind, runtime: 'bash', code: 'ls -d /proc/[0-9]* | wc -l' });
    assert.equal(calm.exitCode, 0, calm.stderr);
    // init, fork server, this call's leader, bash, ls (and wc): nothing of the bomb.
    assert.ok(Number(calm.stdout.trim()) <= 6, `processes in the worker: ${calm.stdout}`);

    const disk = { memoryMiB: 128, diskMiB: 32 };
    const fill = await run({
      ...disk,
      runtime: 'python',
      code: 'import errno\nf = open("fill", "wb")\ntry:\n    while True:\n        f.write(b"x" * (1 << 20)); f.flush()\nexcept OSError as e:\n    print(errno.errorcode[e.errno])',
    });
    assert.equal(fill.stdout, 'ENOSPC\n', fill.stderr);
    const room = await run({ ...disk, runtime: 'python', code: 'import os\ns = os.statvfs("/tmp")\nprint(s.f_bavail * s.f_frsize >> 20)' });
    assert.ok(room.worker === fill.worker || fill.workerReplaced, 'the same worker, unless it was replaced');
    assert.ok(Number(room.stdout) >= 20, `MiB free for the next call: ${room.stdout}`);
  });
});
