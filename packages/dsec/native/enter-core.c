/*
 * Starting a command in a running container sandbox, as `crun exec` does, without crun: the part
 * shared by dsec-spawn's `enter` request (spawn-enter.c: the edge's path, no exec but the
 * command's) and the dsec-enter binary (enter.c). See enter-core.h for the calls.
 *
 * `crun exec` is most of a command's cost in dsec: it loads its libraries, reads the container's
 * state and config.json (JSON), re-reads its own binary, then joins the namespaces one by one.
 * Timed on this host, `crun exec ID /bin/true` takes 6.4 ms where `nsenter` into the same
 * namespaces takes 2.1 ms and a plain fork+exec 0.8 ms. This does what crun exec does for a dsec
 * sandbox's command, and only that, in the order crun does it:
 *
 *   1. Is given the command's argv and environment by its caller (never on a command line: the
 *      environment may hold secrets), as `<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...`.
 *   2. Opens what it needs of the host (/dev/null for its own stdio, cap_last_cap) while its
 *      mount namespace is still the host's: after step 4 those paths are the sandbox's to choose.
 *      Opens the sandbox's init as a pidfd and checks it is that sandbox's init (pid 1 of its
 *      pid namespace, in cgroup /dsec/ID): a pid recycled after the sandbox died is refused.
 *   3. Opens, as host root, DIR/cgroup.procs of each --cgroup-dir: the sandbox's cgroup in every
 *      hierarchy (each v1 controller's and the cgroup2 one), as the edge sees them under
 *      /sys/fs/cgroup, which is where crun made them. After the fork it moves the command into each
 *      before the command goes on (a pipe holds it), as crun exec moves its child. It does not join
 *      them itself: it waits on the host's side, outside the sandbox's processes and limits. The
 *      paths come from the edge rather than from /proc/<init>/cgroup, which names cgroups from the
 *      hierarchy's root: where /sys/fs/cgroup/memory is a container's cgroup bound there (an edge
 *      in a container), those names are not paths under it, and the memory limit was missed.
 *   4. Makes itself non-dumpable (nothing in the sandbox may ptrace or open /proc/<pid>/ of a
 *      process that is still this host binary), sets RLIMIT_NOFILE, and joins every namespace of
 *      the init that differs from its own (user, mount, pid, network, IPC, UTS, cgroup) in one
 *      setns() on the pidfd: the kernel joins the user namespace first.
 *   5. Forks: the child is born in the sandbox's pid namespace. This process writes its host pid
 *      to the --pid-file when given one, waits for it and exits with its status (128 + the
 *      signal's number when a signal ended it), as crun exec does.
 *   6. The child drops the capabilities outside MASK from its bounding set, sets no
 *      supplementary groups, the gid and the uid, then exactly MASK as effective and permitted
 *      (none inheritable or ambient), makes itself non-dumpable again (the uid change reset it
 *      to fs.suid_dumpable), HOME from the sandbox's /etc/passwd when the environment has none
 *      (as crun does), umask 022, the cwd, no_new_privs, closes every fd above the preserved
 *      ones, puts itself in the command's Landlock domain (--landlock: landlock-domain.c, what
 *      `dsec-landlock --isolate` or `--rw` would do after an exec of its own), loads the
 *      sandbox's seccomp program (the same BPF the edge handed crun at create, precompiled) and
 *      execs the command, looked up in the environment's PATH.
 *
 * Failures before the command runs end with exit status 255 and a message on stderr, as crun
 * exec's do. The tty case (a terminal for the command) is not handled here: crun exec does it.
 */
#define _GNU_SOURCE
#include "enter-core.h"
#include "landlock-domain.h"
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAILED ENTER_FAILED
#define MAX_SECCOMP (1 << 20)

extern char **environ;

const char *enter_name = "dsec-enter";

static void die(const char *what, const char *detail) {
  fprintf(stderr, "%s: %s%s%s: %s\n", enter_name, what, detail ? " " : "", detail ? detail : "", strerror(errno));
  _exit(FAILED);
}

static void die_plain(const char *text) {
  fprintf(stderr, "%s: %s\n", enter_name, text);
  _exit(FAILED);
}


static long number(const char *flag, const char *text, long min, long max) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || *end || end == text || v < min || v > max) {
    fprintf(stderr, "%s: %s %s is not a number in [%ld, %ld]\n", enter_name, flag, text, min, max);
    _exit(FAILED);
  }
  return v;
}

void enter_parse(int argc, char **argv, struct enter_options *o) {
  memset(o, 0, sizeof *o);
  o->pid = o->uid = o->gid = o->nofile = -1;
  int have_caps = 0;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) die_plain("every option takes a value");
    const char *f = argv[i], *v = argv[i + 1];
    if (!strcmp(f, "--pid")) o->pid = number(f, v, 2, 0x3fffffff);
    else if (!strcmp(f, "--uid")) o->uid = number(f, v, 0, 0xfffffffe);
    else if (!strcmp(f, "--gid")) o->gid = number(f, v, 0, 0xfffffffe);
    else if (!strcmp(f, "--nofile")) o->nofile = number(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--preserve-fds")) o->preserve = number(f, v, 0, 64);
    else if (!strcmp(f, "--cgroup")) o->cgroup = v;
    else if (!strcmp(f, "--spec")) o->spec = v;
    else if (!strcmp(f, "--pid-file")) o->pid_file = v;
    else if (!strcmp(f, "--cwd")) o->cwd = v;
    else if (!strcmp(f, "--seccomp")) o->seccomp = v;
    else if (!strcmp(f, "--landlock")) {
      if (!strcmp(v, "isolate")) o->landlock = ENTER_LANDLOCK_ISOLATE;
      else if (!strcmp(v, "rw")) o->landlock = ENTER_LANDLOCK_RW;
      else die_plain("--landlock takes isolate or rw");
    }
    else if (!strcmp(f, "--rw")) {
      if (o->nrw >= ENTER_MAX_RW) die_plain("too many --rw options");
      o->rw[o->nrw++] = argv[i + 1];
    }
    else if (!strcmp(f, "--cgroup-dir")) {
      if (o->ncgroup_dirs >= ENTER_MAX_CGROUP_DIRS) die_plain("at most 64 --cgroup-dir options");
      if (v[0] != '/') die_plain("--cgroup-dir takes an absolute path");
      o->cgroup_dirs[o->ncgroup_dirs++] = v;
    }
    else if (!strcmp(f, "--caps")) {
      char *end;
      errno = 0;
      o->caps = strtoull(v, &end, 16);
      if (errno || *end || end == v) die_plain("--caps takes a hexadecimal mask");
      have_caps = 1;
    } else {
      fprintf(stderr, "%s: unknown option %s\n", enter_name, f);
      _exit(FAILED);
    }
  }
  if (o->pid < 0 || o->uid < 0 || o->gid < 0 || o->nofile < 0 || !have_caps || !o->cgroup || !o->cwd || o->ncgroup_dirs == 0) {
    die_plain("usage: --pid PID --cgroup /dsec/ID [--pid-file FILE] --uid UID --gid GID --cwd DIR --caps MASK --nofile N [--seccomp FILE] [--preserve-fds N] [--landlock isolate|rw [--rw PATH]...] --cgroup-dir DIR [--cgroup-dir DIR]...");
  }
  if (o->nrw > 0 && o->landlock != ENTER_LANDLOCK_RW) die_plain("--rw goes with --landlock rw");
}

/* A whole small file, NUL-terminated; `what` names it in errors. */
char *enter_slurp(const char *path, size_t max, size_t *len, const char *what) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) die(what, path);
  char *buf = malloc(max + 1);
  if (!buf) die_plain("out of memory");
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, max - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) die(what, path);
    if (r == 0) break;
    n += (size_t)r;
    if (n == max) die_plain("a file it reads is larger than it accepts");
  }
  close(fd);
  buf[n] = 0;
  *len = n;
  return buf;
}

/* `<count>\0<string>\0...` at *off: a NULL-terminated array pointing into buf. */
char **enter_strings(char *buf, size_t len, size_t *off, const char *what) {
  if (*off >= len) die_plain("the spec ends early");
  char *end;
  long count = strtol(buf + *off, &end, 10);
  if (*end || count < 0 || count > 1 << 20) die_plain("the spec is malformed");
  *off += strlen(buf + *off) + 1;
  char **out = calloc((size_t)count + 1, sizeof *out);
  if (!out) die_plain("out of memory");
  for (long i = 0; i < count; i++) {
    if (*off >= len) {
      fprintf(stderr, "%s: the spec ends inside its %s\n", enter_name, what);
      _exit(FAILED);
    }
    out[i] = buf + *off;
    *off += strlen(buf + *off) + 1;
  }
  return out;
}

static int has_env(char **env, const char *name) {
  size_t n = strlen(name);
  for (; *env; env++)
    if (!strncmp(*env, name, n) && (*env)[n] == '=') return 1;
  return 0;
}

/* The line of `path` (a /proc file) that begins with `prefix`, copied into out. */
static int proc_line(const char *path, const char *prefix, char *out, size_t size) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  char line[4096];
  int found = -1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, prefix, strlen(prefix))) continue;
    snprintf(out, size, "%s", line);
    found = 0;
    break;
  }
  fclose(f);
  return found;
}

/*
 * Whether the pid is the sandbox's init: pid 1 in the innermost pid namespace it is in (the last
 * field of NSpid) and in cgroup `cgroup` itself (its cgroup2 path, or on a v1-only host a
 * hierarchy's, ending with it). The edge's own record gave the pid; this guards the window where the sandbox
 * died and the number went to another process.
 */
static void check_init(long pid, const char *cgroup) {
  char path[64], line[4096];
  snprintf(path, sizeof path, "/proc/%ld/status", pid);
  if (proc_line(path, "NSpid:", line, sizeof line) != 0) die("cannot read the sandbox init's", path);
  char *last = strrchr(line, '\t');
  if (!last || strtol(last + 1, NULL, 10) != 1) die_plain("the pid given is not the sandbox's init (not pid 1 of its namespace): the sandbox has stopped");
  snprintf(path, sizeof path, "/proc/%ld/cgroup", pid);
  FILE *f = fopen(path, "re");
  if (!f) die("cannot read the sandbox init's", path);
  int v2 = 0, v2_match = 0, v1 = 0, v1_match = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *rel = strchr(line, ':');
    rel = rel ? strchr(rel + 1, ':') : NULL;
    if (!rel) continue;
    rel++;
    /* Ends with it: a hierarchy whose root is a container's cgroup names the path below that root's own. */
    size_t nrel = strlen(rel), ncg = strlen(cgroup);
    int match = nrel >= ncg && !strcmp(rel + nrel - ncg, cgroup);
    if (!strncmp(line, "0::", 3)) v2 = 1, v2_match = match;
    else v1++, v1_match += match;
  }
  fclose(f);
  if (v2 ? !v2_match : (v1 == 0 || v1_match == 0)) die_plain("the pid given is not in the sandbox's cgroup: the sandbox has stopped");
}

/*
 * Opens, as host root and before any namespace is joined, DIR/cgroup.procs of each --cgroup-dir
 * (see step 3). The kernel checks a migration against the opener's credentials and cgroup
 * namespace (since 5.16): host root's here, whatever this process has become by the time it
 * writes. A cgroup that is not there is an error: a command must never run outside the
 * sandbox's limits.
 */
static void open_cgroups(const struct enter_options *o, int *fds) {
  for (int i = 0; i < o->ncgroup_dirs; i++) {
    char procs[8192];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", o->cgroup_dirs[i]);
    fds[i] = open(procs, O_WRONLY | O_CLOEXEC);
    if (fds[i] < 0) die("cannot open the sandbox's cgroup", procs);
  }
}

/* CLONE_NEW* of each namespace the init is in that this process is not. */
static int namespaces_to_join(long pid) {
  static const struct { const char *name; int flag; } kinds[] = {
    { "user", CLONE_NEWUSER }, { "mnt", CLONE_NEWNS }, { "pid", CLONE_NEWPID }, { "net", CLONE_NEWNET },
    { "ipc", CLONE_NEWIPC }, { "uts", CLONE_NEWUTS }, { "cgroup", CLONE_NEWCGROUP },
  };
  int flags = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    char mine[64], theirs[64];
    struct stat a, b;
    snprintf(mine, sizeof mine, "/proc/self/ns/%s", kinds[i].name);
    snprintf(theirs, sizeof theirs, "/proc/%ld/ns/%s", pid, kinds[i].name);
    if (stat(mine, &a) != 0) continue; /* a kernel without that kind of namespace */
    if (stat(theirs, &b) != 0) die("cannot read the sandbox init's namespace", theirs);
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev) flags |= kinds[i].flag;
  }
  /* Every dsec sandbox has its own mount and pid namespaces; anything else is not one. */
  if (!(flags & CLONE_NEWNS) || !(flags & CLONE_NEWPID)) die_plain("the pid given shares this host's mount or pid namespace: not a sandbox's init");
  return flags;
}

/* HOME as crun sets it when the environment has none: the user's entry in the sandbox's /etc/passwd, else /. */
static char *home_of(long uid) {
  static char home[4096 + 6];
  snprintf(home, sizeof home, "HOME=/");
  /* The sandbox's file, read after the namespaces are joined; O_NONBLOCK so a FIFO there cannot hang us. */
  int fd = open("/etc/passwd", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0) return home;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return home;
  }
  FILE *f = fdopen(fd, "re");
  if (!f) {
    close(fd);
    return home;
  }
  char line[8192];
  for (int lines = 0; lines < 100000 && fgets(line, sizeof line, f); lines++) {
    /* name:password:uid:gid:gecos:dir:shell */
    char *field[7] = { 0 };
    char *p = line;
    int n = 0;
    for (; n < 7 && p; n++) {
      field[n] = p;
      p = strchr(p, ':');
      if (p) *p++ = 0;
    }
    if (n < 6) continue;
    char *end;
    long u = strtol(field[2], &end, 10);
    if (*end || end == field[2] || u != uid) continue;
    field[5][strcspn(field[5], "\n")] = 0;
    if (field[5][0]) snprintf(home, sizeof home, "HOME=%s", field[5]);
    break;
  }
  fclose(f);
  return home;
}

static void set_capabilities(unsigned long long mask) {
  struct __user_cap_header_struct head = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  data[0].effective = data[0].permitted = (uint32_t)mask;
  data[1].effective = data[1].permitted = (uint32_t)(mask >> 32);
  if (syscall(SYS_capset, &head, data) != 0) die("capset", NULL);
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) die("clearing the ambient capabilities", NULL);
}

/*
 * The highest capability number this kernel knows, read from the host's /proc before the
 * namespaces are joined: after setns, /proc is the sandbox's, and what it says there is not ours
 * to trust (a 0 would leave every capability but one in the bounding set).
 */
static int last_capability(void) {
  int last = 63;
  char text[16] = "";
  int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, text, sizeof text - 1);
    if (n > 0) last = atoi(text);
    close(fd);
  }
  return last < 0 || last > 63 ? 63 : last;
}

static void drop_bounding(unsigned long long mask, int last) {
  for (int cap = 0; cap <= last; cap++) {
    if (mask & (1ULL << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) die("dropping a capability from the bounding set", NULL);
  }
}

/* In the sandbox's namespaces, as its root: become the command. */
static void become_command(const struct enter_options *o, int last_cap, char **args, char **env, const struct sock_fprog *filter) {
  umask(022);
  drop_bounding(o->caps, last_cap);
  if (setgroups(0, NULL) != 0 && errno != EPERM) die("setgroups", NULL);
  if (setresgid((gid_t)o->gid, (gid_t)o->gid, (gid_t)o->gid) != 0) die("setresgid", NULL);
  if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) die("PR_SET_KEEPCAPS", NULL);
  if (setresuid((uid_t)o->uid, (uid_t)o->uid, (uid_t)o->uid) != 0) die("setresuid", NULL);
  set_capabilities(o->caps);
  if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0) die("PR_SET_KEEPCAPS", NULL);
  /* The uid change made this process as dumpable as fs.suid_dumpable says: where that is 1, a
   * process of the sandbox with the same uid could open its /proc/<pid>/mem and run code here
   * before the seccomp filter is loaded. Until the exec it stays the host's binary. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) die("PR_SET_DUMPABLE", NULL);
  if (!has_env(env, "HOME")) {
    size_t n = 0;
    while (env[n]) n++;
    char **more = calloc(n + 2, sizeof *more);
    if (!more) die_plain("out of memory");
    memcpy(more, env, n * sizeof *more);
    more[n] = home_of(o->uid);
    env = more;
  }
  if (chdir(o->cwd) != 0) die("chdir", o->cwd);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("PR_SET_NO_NEW_PRIVS", NULL);
  if (syscall(SYS_close_range, 3 + (unsigned)o->preserve, ~0U, 0) != 0) die("close_range", NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* An ignored signal stays ignored across exec: dsec-spawn ignores SIGPIPE, the command must not. */
  signal(SIGPIPE, SIG_DFL);
  /* The command's Landlock domain, in the command's own process (dsec-landlock's work, without
   * its exec): after the uid change, so its paths are opened as the command's user, and before
   * the sandbox's filter, as dsec-landlock applied it under the filter's allowance. */
  if (o->landlock != ENTER_LANDLOCK_NONE) {
    char why[512];
    if (landlock_domain(o->landlock == ENTER_LANDLOCK_ISOLATE, o->rw, o->nrw, why, sizeof why) != 0) {
      fprintf(stderr, "%s: %s\n", enter_name, why);
      _exit(126);
    }
  }
  environ = env;
  /* Last: the sandbox's filter may refuse what the steps above need. */
  if (filter && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, filter) != 0) die("loading the sandbox's seccomp filter", NULL);
  execvp(args[0], args);
  /* As a shell says it (127 not found, 126 not runnable): the command's stderr is an agent's
   * observation, with no helper's name in it. */
  int err = errno;
  if (err == ENOENT && !strchr(args[0], '/')) fprintf(stderr, "%s: command not found\n", args[0]);
  else fprintf(stderr, "%s: %s\n", args[0], strerror(err));
  _exit(err == ENOENT ? 127 : 126);
}

int enter_run(const struct enter_options *o, char **args, char **env) {
  if (!args[0]) die_plain("the spec has an empty argv");
  struct sock_fprog filter = { 0 }, *loaded = NULL;
  if (o->seccomp) {
    size_t n;
    char *bpf = enter_slurp(o->seccomp, MAX_SECCOMP, &n, "cannot read the seccomp program");
    if (n == 0 || n % sizeof(struct sock_filter) != 0) die_plain("the seccomp program is not whole BPF instructions");
    /* The kernel's bound (and sock_fprog's length is 16 bits: a longer file must not wrap into a shorter program). */
    if (n / sizeof(struct sock_filter) > BPF_MAXINSNS) die_plain("the seccomp program is longer than the kernel accepts");
    filter.len = (unsigned short)(n / sizeof(struct sock_filter));
    filter.filter = (struct sock_filter *)bpf;
    loaded = &filter;
  }

  /* Where the command's host pid is written, when asked (the edge finds it as this process's child instead). */
  int pid_out = -1;
  if (o->pid_file) {
    pid_out = open(o->pid_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (pid_out < 0) die("cannot open the pid file", o->pid_file);
  }

  /* Host files, opened before the sandbox's mount namespace is joined: after it, "/dev/null" is
   * whatever the sandbox put there (without a user namespace, a FIFO or device node of its own,
   * opened by host root). */
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0) die("cannot open", "/dev/null");
  int last_cap = last_capability();

  int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)o->pid, 0);
  if (pidfd < 0) die("the sandbox's init is gone: pidfd_open", NULL);
  check_init(o->pid, o->cgroup);
  int flags = namespaces_to_join(o->pid);
  int cgroups[64];
  int ncgroups = o->ncgroup_dirs;
  open_cgroups(o, cgroups);
  /* The command waits on this until it is in the sandbox's cgroups. */
  int go[2];
  if (pipe2(go, O_CLOEXEC) != 0) die("pipe2", NULL);
  /* Still the process checked above (a recycled pid would have failed the pidfd). */
  if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0) die("the sandbox's init is gone", NULL);

  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) die("PR_SET_DUMPABLE", NULL);
  struct rlimit nofile = { (rlim_t)o->nofile, (rlim_t)o->nofile };
  if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) die("setrlimit(RLIMIT_NOFILE)", NULL);
  if (setns(pidfd, flags) != 0) die("setns into the sandbox's namespaces", NULL);
  close(pidfd);

  pid_t child = fork();
  if (child < 0) die("fork", NULL);
  if (child == 0) {
    close(go[1]);
    for (int i = 0; i < ncgroups; i++) close(cgroups[i]);
    char moved;
    if (read(go[0], &moved, 1) != 1) _exit(FAILED); /* not moved: the parent says why */
    close(go[0]);
    become_command(o, last_cap, args, env, loaded);
  }
  close(go[0]);
  char text[32];
  int n = snprintf(text, sizeof text, "%d", (int)child);
  for (int i = 0; i < ncgroups; i++) {
    if (write(cgroups[i], text, (size_t)n) != n) {
      int saved = errno;
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
      errno = saved;
      die("cannot move the command into the sandbox's cgroup", NULL);
    }
    close(cgroups[i]);
  }
  if (write(go[1], "1", 1) != 1) die("releasing the command", NULL);
  close(go[1]);

  /* The command's stdio and preserved fds are its own: this process keeps only stderr (for its
   * own errors), so a command that closes its stdin is not kept alive by a reader here. */
  dup2(null, STDIN_FILENO);
  dup2(null, STDOUT_FILENO);
  close(null);
  for (long fd = 3; fd < 3 + o->preserve; fd++) close((int)fd);
  if (pid_out >= 0) {
    if (write(pid_out, text, (size_t)n) != n) fprintf(stderr, "%s: writing the pid file: %s\n", enter_name, strerror(errno));
    close(pid_out);
  }
  int status;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) die("waitpid", NULL);
  }
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}
