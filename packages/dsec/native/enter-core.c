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
 * Steps 2 and 3 (and the seccomp program's read) are enter_prepare: dsec-spawn does them once per
 * sandbox and keeps the result while its init lives (spawn-sandboxes.c), its starters then only
 * check through the kept pidfd that the init still runs; the dsec-enter binary prepares each time.
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


/* A message into why (size bytes), and -1: the non-fatal steps' way to fail (enter_prepare). */
static int fail_with(char *why, size_t size, const char *what, const char *detail, int with_errno) {
  int saved = errno;
  /* A long path is cut short rather than the message lost. */
  if (snprintf(why, size, "%s%s%s%s%s", what, detail ? " " : "", detail ? detail : "", with_errno ? ": " : "", with_errno ? strerror(saved) : "") < 0) why[0] = 0;
  errno = saved;
  return -1;
}

static int number(const char *flag, const char *text, long min, long max, long *out, char *why, size_t size) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || *end || end == text || v < min || v > max) {
    snprintf(why, size, "%s %s is not a number in [%ld, %ld]", flag, text, min, max);
    return -1;
  }
  *out = v;
  return 0;
}

int enter_parse_options(int argc, char **argv, struct enter_options *o, char *why, size_t size) {
  memset(o, 0, sizeof *o);
  o->pid = o->uid = o->gid = o->nofile = -1;
  int have_caps = 0;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return fail_with(why, size, "every option takes a value", NULL, 0);
    const char *f = argv[i], *v = argv[i + 1];
    int bad = 0;
    if (!strcmp(f, "--pid")) bad = number(f, v, 2, 0x3fffffff, &o->pid, why, size);
    else if (!strcmp(f, "--uid")) bad = number(f, v, 0, 0xfffffffe, &o->uid, why, size);
    else if (!strcmp(f, "--gid")) bad = number(f, v, 0, 0xfffffffe, &o->gid, why, size);
    else if (!strcmp(f, "--nofile")) bad = number(f, v, 1, 1 << 30, &o->nofile, why, size);
    else if (!strcmp(f, "--preserve-fds")) bad = number(f, v, 0, 64, &o->preserve, why, size);
    else if (!strcmp(f, "--standby")) {
      long on;
      bad = number(f, v, 0, 1, &on, why, size);
      o->standby = (int)on;
    }
    else if (!strcmp(f, "--cgroup")) o->cgroup = v;
    else if (!strcmp(f, "--spec")) o->spec = v;
    else if (!strcmp(f, "--pid-file")) o->pid_file = v;
    else if (!strcmp(f, "--cwd")) o->cwd = v;
    else if (!strcmp(f, "--seccomp")) o->seccomp = v;
    else if (!strcmp(f, "--landlock")) {
      if (!strcmp(v, "isolate")) o->landlock = ENTER_LANDLOCK_ISOLATE;
      else if (!strcmp(v, "rw")) o->landlock = ENTER_LANDLOCK_RW;
      else return fail_with(why, size, "--landlock takes isolate or rw", NULL, 0);
    }
    else if (!strcmp(f, "--rw")) {
      if (o->nrw >= ENTER_MAX_RW) return fail_with(why, size, "too many --rw options", NULL, 0);
      o->rw[o->nrw++] = argv[i + 1];
    }
    else if (!strcmp(f, "--cgroup-dir")) {
      if (o->ncgroup_dirs >= ENTER_MAX_CGROUP_DIRS) return fail_with(why, size, "at most 64 --cgroup-dir options", NULL, 0);
      if (v[0] != '/') return fail_with(why, size, "--cgroup-dir takes an absolute path", NULL, 0);
      o->cgroup_dirs[o->ncgroup_dirs++] = v;
    }
    else if (!strcmp(f, "--command-cgroup")) {
      if (v[0] != '/') return fail_with(why, size, "--command-cgroup takes an absolute path", NULL, 0);
      o->command_cgroup = v;
    }
    else if (!strcmp(f, "--caps")) {
      char *end;
      errno = 0;
      o->caps = strtoull(v, &end, 16);
      if (errno || *end || end == v) return fail_with(why, size, "--caps takes a hexadecimal mask", NULL, 0);
      have_caps = 1;
    } else {
      snprintf(why, size, "unknown option %s", f);
      return -1;
    }
    if (bad) return -1;
  }
  if (o->pid < 0 || o->uid < 0 || o->gid < 0 || o->nofile < 0 || !have_caps || !o->cgroup || !o->cwd || o->ncgroup_dirs == 0) {
    return fail_with(why, size, "usage: --pid PID --cgroup /dsec/ID [--pid-file FILE] --uid UID --gid GID --cwd DIR --caps MASK --nofile N [--seccomp FILE] [--preserve-fds N] [--standby 0|1] [--landlock isolate|rw [--rw PATH]...] --cgroup-dir DIR [--cgroup-dir DIR]... [--command-cgroup DIR]", NULL, 0);
  }
  if (o->nrw > 0 && o->landlock != ENTER_LANDLOCK_RW) return fail_with(why, size, "--rw goes with --landlock rw", NULL, 0);
  if (o->command_cgroup) {
    /* It takes the place of its parent, one of the sandbox's cgroups (below it, in the same hierarchy). */
    o->command_parent = -1;
    const char *slash = strrchr(o->command_cgroup, '/');
    size_t n = (size_t)(slash - o->command_cgroup);
    for (int i = 0; i < o->ncgroup_dirs; i++)
      if (n > 0 && strlen(o->cgroup_dirs[i]) == n && !strncmp(o->cgroup_dirs[i], o->command_cgroup, n)) o->command_parent = i;
    if (o->command_parent < 0 || !slash[1]) return fail_with(why, size, "--command-cgroup must be a directory right below one of the --cgroup-dir", NULL, 0);
  }
  return 0;
}

void enter_parse(int argc, char **argv, struct enter_options *o) {
  char why[1024];
  if (enter_parse_options(argc, argv, o, why, sizeof why) != 0) die_plain(why);
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
static int check_init(long pid, const char *cgroup, char *why, size_t size) {
  char path[64], line[4096];
  snprintf(path, sizeof path, "/proc/%ld/status", pid);
  if (proc_line(path, "NSpid:", line, sizeof line) != 0) return fail_with(why, size, "cannot read the sandbox init's", path, 1);
  char *last = strrchr(line, '\t');
  if (!last || strtol(last + 1, NULL, 10) != 1) return fail_with(why, size, "the pid given is not the sandbox's init (not pid 1 of its namespace): the sandbox has stopped", NULL, 0);
  snprintf(path, sizeof path, "/proc/%ld/cgroup", pid);
  FILE *f = fopen(path, "re");
  if (!f) return fail_with(why, size, "cannot read the sandbox init's", path, 1);
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
  if (v2 ? !v2_match : (v1 == 0 || v1_match == 0)) return fail_with(why, size, "the pid given is not in the sandbox's cgroup: the sandbox has stopped", NULL, 0);
  return 0;
}

/*
 * Opens, as host root and before any namespace is joined, DIR/cgroup.procs (see step 3). The
 * kernel checks a migration against the opener's credentials and cgroup namespace (since 5.16):
 * host root's here, whatever this process has become by the time it writes. A cgroup that is not
 * there is an error: a command must never run outside the sandbox's limits.
 */
static int open_cgroup(const char *dir, char *why, size_t size) {
  char procs[8192];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
  int fd = open(procs, O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail_with(why, size, "cannot open the sandbox's cgroup", procs, 1);
  return fd;
}

/* CLONE_NEW* of each namespace the init is in that this process is not. */
static int namespaces_to_join(long pid, char *why, size_t size) {
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
    if (stat(theirs, &b) != 0) return fail_with(why, size, "cannot read the sandbox init's namespace", theirs, 1);
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev) flags |= kinds[i].flag;
  }
  /* Every dsec sandbox has its own mount and pid namespaces; anything else is not one. */
  if (!(flags & CLONE_NEWNS) || !(flags & CLONE_NEWPID)) return fail_with(why, size, "the pid given shares this host's mount or pid namespace: not a sandbox's init", NULL, 0);
  return flags;
}

/* The seccomp program file, whole: at most MAX_SECCOMP bytes of whole instructions, within the kernel's bound. */
static int read_filter(const char *path, struct sock_fprog *out, char *why, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return fail_with(why, size, "cannot read the seccomp program", path, 1);
  char *buf = malloc(MAX_SECCOMP);
  size_t n = 0;
  while (buf && n < MAX_SECCOMP) {
    ssize_t r = read(fd, buf + n, MAX_SECCOMP - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      fail_with(why, size, "cannot read the seccomp program", path, 1);
      close(fd);
      free(buf);
      return -1;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (!buf) return fail_with(why, size, "out of memory", NULL, 0);
  if (n == MAX_SECCOMP) fail_with(why, size, "a file it reads is larger than it accepts", NULL, 0);
  else if (n == 0 || n % sizeof(struct sock_filter) != 0) fail_with(why, size, "the seccomp program is not whole BPF instructions", NULL, 0);
  /* The kernel's bound (and sock_fprog's length is 16 bits: a longer file must not wrap into a shorter program). */
  else if (n / sizeof(struct sock_filter) > BPF_MAXINSNS) fail_with(why, size, "the seccomp program is longer than the kernel accepts", NULL, 0);
  else {
    /* Kept (a prepared sandbox holds it while the sandbox lives): only its own size. */
    char *fit = realloc(buf, n);
    out->len = (unsigned short)(n / sizeof(struct sock_filter));
    out->filter = (struct sock_filter *)(fit ? fit : buf);
    return 0;
  }
  free(buf);
  return -1;
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

/* env with HOME from the sandbox's /etc/passwd added when it has none (as crun does). */
static char **with_home(char **env, long uid) {
  if (has_env(env, "HOME")) return env;
  size_t n = 0;
  while (env[n]) n++;
  char **more = calloc(n + 2, sizeof *more);
  if (!more) die_plain("out of memory");
  memcpy(more, env, n * sizeof *more);
  more[n] = home_of(uid);
  return more;
}

/*
 * A standby's command (--standby): its cwd, argv and environment, read whole from fd until end of
 * file; the fd is closed before the exec. Nothing at all (the edge let the standby go) ends it.
 */
static void standby_command(int fd, long uid, char ***args, char ***env) {
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  if (!buf) die_plain("out of memory");
  for (;;) {
    if (len == cap) {
      if (cap >= (size_t)64 << 20) die_plain("the command's spec is too large");
      cap *= 2;
      char *more = realloc(buf, cap + 1);
      if (!more) die_plain("out of memory");
      buf = more;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("reading the command's spec", NULL);
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  if (len == 0) _exit(0);
  buf[len] = 0;
  const char *cwd = buf;
  size_t off = strlen(buf) + 1;
  *args = enter_strings(buf, len, &off, "argv");
  *env = with_home(enter_strings(buf, len, &off, "environment"), uid);
  if (!(*args)[0]) die_plain("the spec has an empty argv");
  if (chdir(cwd) != 0) die("chdir", cwd);
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
  if (!o->standby) env = with_home(env, o->uid);
  if (chdir(o->cwd) != 0) die("chdir", o->cwd);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("PR_SET_NO_NEW_PRIVS", NULL);
  /* A standby keeps the fd its command comes on, right after the preserved ones. */
  unsigned spec_fd = 3 + (unsigned)o->preserve;
  if (syscall(SYS_close_range, spec_fd + (o->standby ? 1 : 0), ~0U, 0) != 0) die("close_range", NULL);
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
  if (o->standby) {
    /* What the sandbox's `ps` shows while it waits: not the options, which name host paths (the
     * starter, outside the sandbox, keeps them for the host's listings). */
    static const char words[] = "dsec-enter\0standby";
    if (o->title && o->title_room > sizeof words) {
      memset(o->title, 0, o->title_room);
      memcpy(o->title, words, sizeof words);
    }
    /* Everything above is done: the command is all that is left to know. This process is the
     * sandbox's user, in the command's Landlock domain, under the sandbox's filter, and still not
     * dumpable, so nothing in the sandbox can trace it or open its fds while it waits. */
    standby_command((int)spec_fd, o->uid, &args, &env);
    environ = env;
  }
  execvp(args[0], args);
  /* As a shell says it (127 not found, 126 not runnable): the command's stderr is an agent's
   * observation, with no helper's name in it. */
  int err = errno;
  if (err == ENOENT && !strchr(args[0], '/')) fprintf(stderr, "%s: command not found\n", args[0]);
  else fprintf(stderr, "%s: %s\n", args[0], strerror(err));
  _exit(err == ENOENT ? 127 : 126);
}

void enter_sandbox_close(struct enter_sandbox *s) {
  if (s->pidfd >= 0) close(s->pidfd);
  if (s->null_fd >= 0) close(s->null_fd);
  for (int i = 0; i < s->ncgroups; i++)
    if (s->cgroup_fds[i] >= 0) close(s->cgroup_fds[i]);
  free(s->filter.filter);
  memset(s, 0, sizeof *s);
  s->pidfd = s->null_fd = -1;
}

int enter_prepare(const struct enter_options *o, struct enter_sandbox *s, char *why, size_t size) {
  memset(s, 0, sizeof *s);
  s->pidfd = s->null_fd = -1;
  s->pid = o->pid;
  if (o->seccomp && read_filter(o->seccomp, &s->filter, why, size) != 0) return -1;
  s->has_filter = o->seccomp != NULL;
  /* Host files, opened before the sandbox's mount namespace is joined: after it, "/dev/null" is
   * whatever the sandbox put there (without a user namespace, a FIFO or device node of its own,
   * opened by host root). */
  s->null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (s->null_fd < 0) goto failed_errno;
  s->last_cap = last_capability();
  s->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)o->pid, 0);
  if (s->pidfd < 0) {
    fail_with(why, size, "the sandbox's init is gone: pidfd_open", NULL, 1);
    goto failed;
  }
  if (check_init(o->pid, o->cgroup, why, size) != 0) goto failed;
  s->flags = namespaces_to_join(o->pid, why, size);
  if (s->flags < 0) goto failed;
  for (int i = 0; i < o->ncgroup_dirs; i++) {
    s->cgroup_fds[i] = open_cgroup(o->cgroup_dirs[i], why, size);
    s->ncgroups = i + 1;
    if (s->cgroup_fds[i] < 0) goto failed;
  }
  /* Still the process checked above (a recycled pid would have failed the pidfd). */
  if (syscall(SYS_pidfd_send_signal, s->pidfd, 0, NULL, 0) != 0) {
    fail_with(why, size, "the sandbox's init is gone", NULL, 1);
    goto failed;
  }
  return 0;
failed_errno:
  fail_with(why, size, "cannot open", "/dev/null", 1);
failed:
  enter_sandbox_close(s);
  return -1;
}

int enter_run(const struct enter_options *o, char **args, char **env, const struct enter_sandbox *prepared) {
  if (!args[0]) die_plain("the spec has an empty argv");
  char why[1024];
  struct enter_sandbox own;
  const struct enter_sandbox *s = prepared;
  if (!s) {
    if (enter_prepare(o, &own, why, sizeof why) != 0) die_plain(why);
    s = &own;
  } else if (s->pid != o->pid || s->ncgroups != o->ncgroup_dirs) {
    die_plain("the prepared sandbox is not the one asked for");
  } else if (syscall(SYS_pidfd_send_signal, s->pidfd, 0, NULL, 0) != 0) {
    /* Prepared earlier: the init it checked then is still the one running (a pidfd never follows a recycled pid). */
    die("the sandbox's init is gone", NULL);
  }
  const struct sock_fprog *loaded = s->has_filter ? &s->filter : NULL;

  /* Where the command's host pid is written, when asked (the edge finds it as this process's child instead). */
  int pid_out = -1;
  if (o->pid_file) {
    pid_out = open(o->pid_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (pid_out < 0) die("cannot open the pid file", o->pid_file);
  }
  /* The command's own cgroup, opened as host root like the sandbox's, takes its parent's place. */
  int command_fd = -1;
  if (o->command_cgroup) {
    command_fd = open_cgroup(o->command_cgroup, why, sizeof why);
    if (command_fd < 0) die_plain(why);
  }
  int ncgroups = s->ncgroups;
  /* The command waits on this until it is in the sandbox's cgroups. */
  int go[2];
  if (pipe2(go, O_CLOEXEC) != 0) die("pipe2", NULL);

  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) die("PR_SET_DUMPABLE", NULL);
  struct rlimit nofile = { (rlim_t)o->nofile, (rlim_t)o->nofile };
  if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) die("setrlimit(RLIMIT_NOFILE)", NULL);
  if (setns(s->pidfd, s->flags) != 0) die("setns into the sandbox's namespaces", NULL);

  pid_t child = fork();
  if (child < 0) die("fork", NULL);
  if (child == 0) {
    close(go[1]);
    /* Nothing of the host's stays with the command: its cgroups' files, the init's pidfd (close-on-exec too, closed here first). */
    for (int i = 0; i < ncgroups; i++) close(s->cgroup_fds[i]);
    if (command_fd >= 0) close(command_fd);
    close(s->pidfd);
    char moved;
    if (read(go[0], &moved, 1) != 1) _exit(FAILED); /* not moved: the parent says why */
    close(go[0]);
    become_command(o, s->last_cap, args, env, loaded);
  }
  close(go[0]);
  char text[32];
  int n = snprintf(text, sizeof text, "%d", (int)child);
  for (int i = 0; i < ncgroups; i++) {
    int fd = command_fd >= 0 && i == o->command_parent ? command_fd : s->cgroup_fds[i];
    if (write(fd, text, (size_t)n) != n) {
      int saved = errno;
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
      errno = saved;
      die("cannot move the command into the sandbox's cgroup", NULL);
    }
  }
  if (command_fd >= 0) close(command_fd);
  if (write(go[1], "1", 1) != 1) die("releasing the command", NULL);
  close(go[1]);

  /* The command's stdio and preserved fds are its own: this process keeps only stderr (for its
   * own errors), so a command that closes its stdin is not kept alive by a reader here. */
  dup2(s->null_fd, STDIN_FILENO);
  dup2(s->null_fd, STDOUT_FILENO);
  for (long fd = 3; fd < 3 + o->preserve + o->standby; fd++) close((int)fd);
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
