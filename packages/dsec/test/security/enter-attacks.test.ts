/**
 * Red team, dsec-enter (native/enter-core.c: the edge runs it in a fork of its dsec-spawn, whose
 * command line then reads `dsec-enter ...`; the dsec-enter binary runs the same code): an
 * attacker who is root in a sandbox and runs code between and during its commands goes after the
 * way commands now start. Between the starter's fork and the command's exec the child is still
 * the host's binary (dsec-spawn's memory, or dsec-enter's), holding a host fd
 * (the pid file) and no seccomp filter yet: a process in the sandbox that catches it there (and
 * stops it with SIGSTOP, which it may: the child is in the sandbox's user namespace) must reach
 * neither the host binary nor any fd nor its memory. The sandbox's /etc/passwd (read for HOME)
 * and the command's cwd are the attacker's: a FIFO, a directory, a device, a loop, a huge file or
 * a symlink out must neither hang the start nor let the command out of the sandbox's root. And a
 * command gains nothing through set-user-ID binaries or file capabilities.
 *
 * The same attacks go at an exec's process made ahead (exec-standby.ts), which waits in that
 * window, still dsec-spawn's binary, for as long as the sandbox is between commands.
 *
 * The attacker's tool is a small static C program compiled here (the test images have no
 * compiler); a host without `gcc -static` skips with the reason. One file over 500 lines because
 * it is one attacker against one start path: every test shares the compiled tool and its sandbox.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, sandboxCgroupDir, useServerAndSandbox, type TestServer } from '../helpers/server.js';
import { enterArgvs, enterOptionsOf, hostExecStarters, pollUntil } from '../engine/support/sandbox-procs.js';
import { attack, must } from './support/harness.js';
import { ENTER_BINARY } from '../../src/host/native-helpers.js';
import { runTool, type ToolResult } from '../../src/host/run-tool.js';
import { enterSpec } from '../../src/edge/backends/container/exec/enter-child.js';
import { execStandbyPid, execStandbyWaiting } from '../../src/edge/backends/container/exec/exec-standby.js';

/** The attacker's program (see its modes in main). */
const ATTACKER_C = String.raw`
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

static int broke;
static void got(const char *what, long pid, const char *detail) {
  printf("BROKE %s pid %ld %s\n", what, pid, detail);
  broke++;
}

/* Whether pid is still the dsec-enter binary (forked, not yet exec'd): its cmdline says so. */
static int in_window(long pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  return strstr(buf, "dsec-enter") != NULL;
}

/* Every way at the process's binary, fds and memory; each success is printed as BROKE. */
static void attack(long pid) {
  char path[128], link[4096];
  const char *names[] = { "exe", "root", "cwd", "fd/0", "fd/1", "fd/2", "fd/3", "fd/4", "fd/5", "fd/6", "fd/7", "fd/8" };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    snprintf(path, sizeof path, "/proc/%ld/%s", pid, names[i]);
    if (readlink(path, link, sizeof link - 1) >= 0) got("readlink", pid, path);
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd >= 0) { got("open-read", pid, path); close(fd); }
    fd = open(path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) { got("open-write", pid, path); close(fd); }
    fd = open(path, O_PATH);
    if (fd >= 0) { got("open-path", pid, path); close(fd); }
  }
  const char *files[] = { "mem", "environ", "auxv", "syscall", "stack", "maps", "pagemap", "map_files" };
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(path, sizeof path, "/proc/%ld/%s", pid, files[i]);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      char b[64];
      if (read(fd, b, sizeof b) > 0) got("read", pid, path);
      close(fd);
    }
  }
  /* (Listing /proc/<pid>/fd is not tried: root without a user namespace may, by its
   * CAP_DAC_OVERRIDE, but the numbers alone are no way in; each link needs ptrace access.) */
  if (ptrace(PTRACE_SEIZE, pid, 0, 0) == 0) got("ptrace-seize", pid, "");
  if (ptrace(PTRACE_ATTACH, pid, 0, 0) == 0) got("ptrace-attach", pid, "");
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pidfd >= 0) {
    for (int fd = 0; fd < 16; fd++) {
      int copy = (int)syscall(438 /* pidfd_getfd */, pidfd, fd, 0);
      if (copy >= 0) { got("pidfd_getfd", pid, ""); close(copy); }
    }
    close(pidfd);
  }
  char b[16];
  struct iovec local = { b, sizeof b }, remote = { (void *)0x400000, sizeof b };
  if (syscall(SYS_process_vm_readv, pid, &local, 1, &remote, 1, 0) > 0) got("process_vm_readv", pid, "");
}

/* race WANT STOPFILE: catch WANT processes in the window (stopped there while attacked). */
static int race(long want, const char *stop) {
  static char seen[1 << 22];
  long hits = 0;
  while (hits < want && access(stop, F_OK) != 0) {
    DIR *d = opendir("/proc");
    if (!d) return 2;
    struct dirent *e;
    while ((e = readdir(d))) {
      char *end;
      long pid = strtol(e->d_name, &end, 10);
      if (*end || pid <= 1 || pid == getpid() || pid >= (long)sizeof seen || seen[pid] || !in_window(pid)) continue;
      if (kill((pid_t)pid, SIGSTOP) != 0) continue;
      if (in_window(pid)) {
        seen[pid] = 1;
        hits++;
        attack(pid);
      }
      kill((pid_t)pid, SIGCONT);
    }
    closedir(d);
  }
  printf("hits %ld broke %d\n", hits, broke);
  return broke ? 1 : 0;
}

/* drop-exec UID PATH [ARGS]: become UID (every id), then exec PATH (a set-user-ID binary, say). */
static int drop_exec(char **argv) {
  uid_t uid = (uid_t)atol(argv[2]);
  if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) { perror("setresuid"); return 2; }
  execv(argv[3], argv + 3);
  perror("execv");
  return 2;
}

/* setcap PATH: give PATH every file capability, effective. */
static int setcap(const char *path) {
  struct vfs_cap_data cap = { .magic_etc = VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE };
  cap.data[0].permitted = cap.data[1].permitted = 0xffffffff;
  cap.data[0].inheritable = cap.data[1].inheritable = 0xffffffff;
  if (setxattr(path, "security.capability", &cap, sizeof cap, 0) != 0) { perror("setxattr"); return 2; }
  return 0;
}

/* fifo-reader PATH TRIES: whether anything holds the FIFO PATH open for reading (a writer's
 * non-blocking open succeeds only then), asked TRIES times 10 ms apart. */
static int fifo_reader(const char *path, int tries) {
  for (int i = 0; i < tries; i++) {
    int fd = open(path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) { printf("reader\n"); return 0; }
    usleep(10000);
  }
  printf("none\n");
  return 0;
}

/* denied: two calls the kernel allows anyone on itself and the sandbox's filter refuses: kcmp
 * of this process with itself, and pidfd_getfd of its own stdin. Prints each result or errno. */
static int denied(void) {
  long k = syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0);
  printf("kcmp %s\n", k < 0 ? strerror(errno) : "ok");
  int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  long g = pidfd < 0 ? -1 : syscall(438 /* pidfd_getfd */, pidfd, 0, 0);
  printf("pidfd_getfd %s\n", g < 0 ? strerror(errno) : "ok");
  return 0;
}

/* status: this process's uids and capabilities. */
static int status(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Uid:", 4) || !strncmp(line, "CapPrm", 6) || !strncmp(line, "CapEff", 6)) fputs(line, stdout);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 4 && !strcmp(argv[1], "race")) return race(atol(argv[2]), argv[3]);
  if (argc >= 4 && !strcmp(argv[1], "drop-exec")) return drop_exec(argv);
  if (argc >= 3 && !strcmp(argv[1], "setcap")) return setcap(argv[2]);
  if (argc >= 2 && !strcmp(argv[1], "status")) return status();
  if (argc >= 2 && !strcmp(argv[1], "denied")) return denied();
  if (argc >= 4 && !strcmp(argv[1], "fifo-reader")) return fifo_reader(argv[2], atoi(argv[3]));
  fprintf(stderr, "usage: race WANT STOPFILE | drop-exec UID PATH [ARGS] | setcap PATH | status\n");
  return 2;
}
`;

/** Where the compiled attacker is kept on the host for the file's run (the host baseline runs it). */
let hostAttacker = '';

/** The attacker's program, compiled static for the sandbox; a string saying why not when it cannot be. */
function compileAttacker(): Buffer | string {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-enter-attacker-'));
  try {
    writeFileSync(join(dir, 'a.c'), ATTACKER_C);
    const cc = spawnSync('gcc', ['-static', '-O1', '-o', join(dir, 'a'), join(dir, 'a.c')], { encoding: 'utf8' });
    if (cc.error || cc.status !== 0) return `gcc -static failed: ${cc.error?.message ?? cc.stderr}`;
    const bin = readFileSync(join(dir, 'a'));
    hostAttacker = spawnSync(join(dir, 'a'), ['denied'], { encoding: 'utf8' }).stdout;
    return bin;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const ATTACKER = '/usr/local/bin/attacker';

/** A command's HOME when the sandbox's /etc/passwd gives none (as crun sets it). */
const NO_HOME = '/';

describe('red team: dsec-enter', { skip: integrationSkipReason(), timeout: 240_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let skipReason: string | undefined;

  useServerAndSandbox({ resources: { memoryMiB: 256 } }, (s, b) => {
    server = s;
    sb = b;
  });

  before(async () => {
    const bin = compileAttacker();
    if (typeof bin === 'string') {
      skipReason = bin;
      return;
    }
    await sb.files.write(ATTACKER, bin, { mode: 0o755 });
    await must(server, sb, ['/bin/sh', '-c', 'cp /etc/passwd /etc/passwd.orig']);
  });

  /** Puts /etc/passwd back as the image had it (after an attack replaced it). */
  async function restorePasswd(): Promise<void> {
    await must(server, sb, ['/bin/sh', '-c', '[ -d /etc ] || mv /etc.gone /etc; rm -rf /etc/passwd && cp /etc/passwd.orig /etc/passwd']);
  }

  test('a process caught between the fork and the exec (stopped there) gives the sandbox no host binary, fd or memory', async (t) => {
    if (skipReason) return t.skip(skipReason);
    const stop = `/tmp/stop-${randomBytes(4).toString('hex')}`;
    const want = 5;
    const racer = await sb.commands.start([ATTACKER, 'race', String(want), stop]);
    try {
      let commands = 0;
      // Commands until the racer caught `want` of them (it then exits), at most 60.
      for (; commands < 60; commands++) {
        const r = await sb.commands.run(['/bin/echo', 'ran']);
        assert.equal(r.exitCode, 0, `a command stopped and attacked in the window failed: ${r.stderr}`);
        assert.equal(r.stdout, 'ran\n');
        if ((await racer.wait({ waitMs: 0 })).status === 'exited') break;
      }
    } finally {
      await sb.files.write(stop, '');
      await racer.wait();
    }
    const out = (await racer.output()).stdout;
    assert.doesNotMatch(out, /BROKE/, out);
    const hits = Number(/^hits (\d+)/m.exec(out)?.[1] ?? 0);
    t.diagnostic(out.trim());
    assert.ok(hits > 0, `the racer never caught a process in the window, so nothing was tried: ${out}`);
  });

  test('the exec process made ahead, waiting for its command, gives the sandbox no host binary, fd or memory, and runs only what the edge sends it', async (t) => {
    if (skipReason) return t.skip(skipReason);
    // After an exec's answer the sandbox's next one is made ahead (exec-standby.ts) and waits,
    // still dsec-spawn's binary with its command's spec pipe open, for as long as the sandbox is
    // between commands. The attacker (a background process: those are never started from a
    // standby nor make one) catches it there, stopped while attacked, then let go, and tries
    // every way in, the spec pipe (its fd 3) included.
    await sb.commands.run(['true']);
    assert.ok(await pollUntil(() => execStandbyWaiting(sb.id)), 'no exec standby was made after a command');
    const stop = `/tmp/stop-${randomBytes(4).toString('hex')}`;
    const racer = await sb.commands.start([ATTACKER, 'race', '1', stop]);
    const ended = await racer.wait({ waitMs: 60_000 });
    if (ended.status !== 'exited') {
      await sb.files.write(stop, '');
      await racer.wait();
    }
    const out = (await racer.output()).stdout;
    t.diagnostic(out.trim());
    assert.equal(ended.status, 'exited', `the attacker caught nothing in a minute: ${out}`);
    assert.doesNotMatch(out, /BROKE/, out);
    assert.match(out, /^hits 1 broke 0$/m, out);
    assert.ok(execStandbyWaiting(sb.id), 'the standby did not survive being stopped and let go');
    const next = await sb.commands.run(['/bin/sh', '-c', 'echo own; exit 42']);
    assert.equal(next.exitCode, 42, next.stderr);
    assert.equal(next.stdout, 'own\n');
  });

  test('an exec standby killed from inside the sandbox costs the next exec nothing: it starts on its own, and the edge runs on', async () => {
    await sb.commands.run(['true']);
    // Its command line in the sandbox reads `dsec-enter standby` (exec-standby.ts) once it is set
    // up and waits for its spec; the edge counts it as waiting from the moment it asks for it.
    const retitled = (): boolean => {
      const pid = execStandbyPid(sb.id);
      try {
        return pid !== undefined && readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('dsec-enter\0standby\0');
      } catch {
        return false; // gone
      }
    };
    assert.ok(await pollUntil(retitled), 'no exec standby was made after a command, or it never came to wait for its spec');
    const killed = await sb.commands.start([
      '/bin/sh',
      '-c',
      'for d in /proc/[0-9]*; do case "$(tr "\\0" " " < $d/cmdline 2>/dev/null)" in "dsec-enter standby "*) kill -9 ${d#/proc/} && echo killed;; esac; done; true',
    ]);
    await killed.wait();
    assert.match((await killed.output()).stdout, /killed/, 'the standby was not found from inside');
    assert.ok(await pollUntil(() => !execStandbyWaiting(sb.id)), 'the edge still counts the killed standby as waiting');
    const next = await sb.commands.run(['/bin/sh', '-c', 'echo own; exit 42']);
    assert.equal(next.exitCode, 42, next.stderr);
    assert.equal(next.stdout, 'own\n');
  });

  /**
   * Runs dsec-enter for the sandbox straight from the host, as the edge does, with an environment
   * without HOME (the images here set HOME, so the edge's commands never look it up) and `cwd`.
   * The hang guard kills it after 20 s; the test then fails on the kill, not on a clock.
   */
  async function enterDirectly(cmd: string[], cwd: string): Promise<ToolResult> {
    const tag = randomBytes(4).toString('hex');
    const hold = await sb.commands.start(['/bin/sh', '-c', `while [ ! -e /tmp/go-${tag} ]; do sleep 0.05; done`]);
    let argv: string[] | undefined;
    try {
      assert.ok(await pollUntil(() => (argv = enterArgvs(sb.id)[0]) !== undefined), 'no dsec-enter process for a running command');
    } finally {
      await sb.files.write(`/tmp/go-${tag}`, '');
      await hold.wait();
    }
    const { dir, flags } = enterOptionsOf(argv!);
    const spec = join(dir, `direct-${tag}.spec`);
    writeFileSync(spec, enterSpec(cmd, ['PATH=/usr/bin:/bin']), { mode: 0o600 });
    try {
      return await runTool(ENTER_BINARY, [...flags, '--spec', spec, '--pid-file', `${spec}.pid`, '--cwd', cwd], {
        signal: AbortSignal.timeout(20_000),
      });
    } finally {
      rmSync(spec, { force: true });
      rmSync(`${spec}.pid`, { force: true });
    }
  }

  test('a hostile /etc/passwd (FIFO, directory, device, loop, symlink out, huge, missing /etc) neither hangs a start nor breaks HOME', async (t) => {
    if (skipReason) return t.skip(skipReason);
    const cases: Record<string, string> = {
      'a FIFO nobody writes': 'rm /etc/passwd && mkfifo /etc/passwd',
      'a directory': 'rm /etc/passwd && mkdir /etc/passwd',
      'a symlink to a device': 'rm /etc/passwd && ln -s /dev/zero /etc/passwd',
      'a symlink loop': 'rm /etc/passwd && ln -s /etc/passwd /etc/passwd',
      "a symlink to the starting process's fds": 'rm /etc/passwd && ln -s /proc/self/fd/3 /etc/passwd',
      "a symlink to the starting process's binary": 'rm /etc/passwd && ln -s /proc/self/exe /etc/passwd',
      'a 1 GiB file of one line with no newline':
        'rm /etc/passwd && dd if=/dev/zero of=/etc/passwd bs=1 count=0 seek=1073741824 2>/dev/null',
      missing: 'rm /etc/passwd',
      '/etc missing': 'mv /etc /etc.gone',
    };
    // The baseline: the image's own /etc/passwd gives root's home.
    const plain = await enterDirectly(['/bin/sh', '-c', 'echo "$HOME"'], '/');
    assert.equal(plain.code, 0, plain.stderr);
    assert.equal(plain.stdout, '/root\n');
    for (const [name, setup] of Object.entries(cases)) {
      await must(server, sb, ['/bin/sh', '-c', setup]);
      try {
        const r = await enterDirectly(['/bin/sh', '-c', 'echo "$HOME"'], '/');
        assert.equal(r.code, 0, `/etc/passwd ${name}: exit ${r.code}, ${r.stderr}`);
        assert.equal(r.stdout, `${NO_HOME}\n`, `/etc/passwd ${name}: HOME`);
      } finally {
        await restorePasswd();
      }
    }
  });

  test("a cwd that leads out (symlinks up, /proc/1/root, /proc/self/root) stays in the sandbox's root", async (t) => {
    if (skipReason) return t.skip(skipReason);
    await must(server, sb, [
      '/bin/sh',
      '-c',
      'mkdir -p /tmp/a/b && ln -sfn ../../../../../../.. /tmp/a/b/up && ln -sfn /proc/1/root /tmp/initroot',
    ]);
    const probe = (tag: string): string[] => [
      '/bin/sh',
      '-c',
      `readlink /proc/self/root; stat -c %d:%i / .; touch ./redteam-${tag} && echo made`,
    ];
    const root = (await must(server, sb, ['/bin/sh', '-c', 'stat -c %d:%i /'])).stdout.trim();
    // Through the API (which checks the cwd is a directory in the sandbox) and straight to dsec-enter.
    const viaApi = ['/tmp/a/b/up'];
    for (const cwd of [...viaApi, '/tmp/initroot', '/proc/1/root', '/proc/self/root', '/proc/1/cwd', '/proc/1/root/../..', '/../../..']) {
      for (const how of viaApi.includes(cwd) ? ['api', 'direct'] : ['direct']) {
        const tag = randomBytes(4).toString('hex');
        const r = how === 'api' ? await attack(server, sb, probe(tag), { cwd }) : await enterDirectly(probe(tag), cwd);
        const code = 'exitCode' in r ? r.exitCode : r.code;
        assert.equal(code, 0, `cwd ${cwd} (${how}): ${r.stderr}`);
        assert.equal(r.stdout, `/\n${root}\n${root}\nmade\n`, `cwd ${cwd} (${how}): the command's root or cwd is not the sandbox's root`);
        assert.equal(await sb.files.exists(`/redteam-${tag}`), true, `cwd ${cwd} (${how}): the file it made is not in the sandbox`);
        assert.equal(existsSync(`/redteam-${tag}`), false, `cwd ${cwd} (${how}): the file it made is on the host`);
        await sb.files.remove(`/redteam-${tag}`);
      }
    }
  });

  test("no privileges beyond the command's own: set-user-ID root and file capabilities give nothing (no_new_privs, bounding set)", async (t) => {
    if (skipReason) return t.skip(skipReason);
    const mine = await must(server, sb, [ATTACKER, 'status']);
    await must(server, sb, [
      '/bin/sh',
      '-c',
      `cp ${ATTACKER} /usr/local/bin/suid && chown 0:0 /usr/local/bin/suid && chmod 4755 /usr/local/bin/suid`,
    ]);
    await must(server, sb, ['/bin/sh', '-c', `cp ${ATTACKER} /usr/local/bin/fcap && ${ATTACKER} setcap /usr/local/bin/fcap`]);
    // Root running a binary with every file capability gets no capability it did not have (or,
    // without a user namespace, the kernel refuses the exec: it cannot grant what the file asks).
    const fcap = await attack(server, sb, ['/usr/local/bin/fcap', 'status']);
    if (fcap.exitCode === 0) assert.equal(fcap.stdout, mine.stdout, "file capabilities raised a root command's capabilities");
    else assert.match(fcap.stderr, /Operation not permitted/, `running a binary with file capabilities: ${fcap.stderr}`);
    // A user that gave up root gets neither root nor capabilities back through either binary.
    for (const bin of ['/usr/local/bin/suid', '/usr/local/bin/fcap']) {
      const r = await attack(server, sb, [ATTACKER, 'drop-exec', '1000', bin, 'status']);
      if (r.exitCode !== 0) {
        assert.match(r.stderr, /^execv: Operation not permitted$/m, `${bin} from uid 1000: ${r.stderr}`);
        continue;
      }
      assert.match(r.stdout, /^Uid:\s+1000\s+1000\s+1000\s+1000$/m, `${bin} gave uid 1000 another uid: ${r.stdout}`);
      assert.match(r.stdout, /^CapPrm:\s+0+$/m, `${bin} gave uid 1000 capabilities: ${r.stdout}`);
      assert.match(r.stdout, /^CapEff:\s+0+$/m, `${bin} gave uid 1000 capabilities: ${r.stdout}`);
    }
  });

  test("the sandbox's seccomp filter is enforced on a command dsec-enter started (calls the kernel allows on the host)", async (t) => {
    if (skipReason) return t.skip(skipReason);
    assert.equal(hostAttacker, 'kcmp ok\npidfd_getfd ok\n', 'the baseline: on the host, the kernel allows both calls');
    const r = await must(server, sb, [ATTACKER, 'denied']);
    assert.equal(r.stdout, 'kcmp Operation not permitted\npidfd_getfd Operation not permitted\n');
  });

  test('argv and environment with odd bytes, empty strings and large values reach the command exactly', async () => {
    const args = ['', 'a b', 'new\nline', 'tab\there', 'x=y', '--', '-c', 'ünïcødé ✓', '$HOME', '\\', 'z'.repeat(100_000)];
    const env: Record<string, string> = { EMPTY: '', EQ: 'a=b=c', NL: 'one\ntwo', UNI: 'ü✓' };
    for (let i = 0; i < 250; i++) env[`MANY_${i}`] = `v${i}`;
    const r = await sb.commands.run(
      [
        '/bin/sh',
        '-c',
        'printf "%s\\0" "$@"; printf "%s\\0" "$EMPTY" "$EQ" "$NL" "$UNI" "$MANY_249"; env | grep -c "^MANY_"',
        'sh',
        ...args,
      ],
      { env },
    );
    assert.equal(r.exitCode, 0, r.stderr);
    // Compared piece by piece (a diff of the 100 kB argument would say nothing).
    const got = r.stdout.split('\0');
    const want = [...args, '', 'a=b=c', 'one\ntwo', 'ü✓', 'v249', '250\n'];
    assert.equal(got.length, want.length, JSON.stringify(got.map((a) => a.slice(0, 40))));
    want.forEach((w, i) =>
      assert.ok(
        got[i] === w,
        `piece ${i}: ${JSON.stringify(got[i]?.slice(0, 80))} (${got[i]?.length} chars), not ${JSON.stringify(w.slice(0, 80))} (${w.length})`,
      ),
    );
  });

  test('a sandbox deleted while many commands start leaves no dsec-enter, command or cgroup on the host', async (t) => {
    if (skipReason) return t.skip(skipReason);
    const victim = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 128 } });
    const starts = Array.from({ length: 12 }, (_, i) =>
      i % 2
        ? victim.commands.start(['/bin/sleep', '600']).then(() => 'started')
        : victim.commands.run(['/bin/sleep', '600']).then((r) => `exit ${r.exitCode}`),
    ).map((p) => p.catch((err: unknown) => `failed: ${(err as Error).message}`));
    // Some starts are under way when the delete comes.
    await pollUntil(() => hostExecStarters(victim.id).length > 0, { tries: 100, intervalMs: 20 });
    // A kill that races an exit being journaled can fail with SANDBOX_KILL_FAILED ("kill it again
    // to retry", an edge race outside dsec-enter): retry once as the error says, and say so.
    await victim.kill().catch(async (err: Error) => {
      t.diagnostic(`the first kill failed, retried: ${err.message}`);
      await victim.kill();
    });
    const outcomes = await Promise.all(starts);
    assert.equal(outcomes.length, 12);
    assert.ok(
      await pollUntil(() => hostExecStarters(victim.id).length === 0),
      `dsec-enter or crun exec left for a deleted sandbox: ${hostExecStarters(victim.id).join(' ')}`,
    );
    for (const controller of ['memory', 'pids', 'cpu', '']) {
      const cgroup = sandboxCgroupDir(controller, victim.id);
      assert.ok(await pollUntil(() => !existsSync(cgroup)), `the deleted sandbox's cgroup is still there: ${cgroup}`);
    }
    // Whatever each start answered, it answered (no call hangs on a start that raced the delete).
    for (const o of outcomes) assert.match(o, /^(started|exit \d+|failed: .+)$/);
  });

  test("dsec-enter (host root) opens the host's /dev/null, never a file the sandbox put at /dev/null", async (t) => {
    if (skipReason) return t.skip(skipReason);
    // Without a user namespace /dev/null is a device node the sandbox may replace; in one it is a
    // bind mount of the host's that cannot be removed (and the attack has nothing to work on).
    const replaced = await attack(server, sb, ['/bin/sh', '-c', 'rm /dev/null && mkfifo -m 666 /dev/null']);
    if (replaced.exitCode !== 0) return t.skip(`the sandbox cannot replace its /dev/null: ${replaced.stderr.trim()}`);
    try {
      // The probe's own dsec-enter waits for it, so that one would be holding the FIFO now.
      const r = await must(server, sb, [ATTACKER, 'fifo-reader', '/dev/null', '20']);
      assert.equal(r.stdout, 'none\n', 'a host process opened the FIFO the sandbox put at /dev/null');
    } finally {
      await must(server, sb, ['/bin/sh', '-c', 'rm /dev/null && mknod -m 666 /dev/null c 1 3']);
    }
  });
});
