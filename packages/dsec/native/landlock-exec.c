/*
 * dsec-landlock: restrict where a command may change files, then become that command.
 *
 *   dsec-landlock [--cgroup-fd FD NAME] --rw PATH [--rw PATH]... -- CMD [ARG]...
 *   dsec-landlock [--cgroup-fd FD NAME] --isolate -- CMD [ARG]...
 *
 * The edge bind-mounts this static binary into every sandbox (read-only, on /dev's tmpfs, like
 * the init) and puts it in front of a command's argv when the request names writable paths.
 * It creates a Landlock ruleset that handles every kind of filesystem change (write, truncate,
 * create, remove, rename/link across directories), allows them beneath each PATH, on /dev's
 * standard nodes (write only) and beneath /dev/shm, /dev/pts and /dev/mqueue, applies it to itself and execs the command: the restriction holds for the command and
 * all its descendants, and nothing of dsec stays resident. Reading and executing stay allowed.
 *
 * With --isolate it changes no file right that matters (it only refuses making block device
 * nodes) but still puts the command in a Landlock domain of its own. The edge starts every
 * command that way: Landlock lets a process in a domain ptrace, read /proc/<pid>/mem or fd/,
 * pidfd_getfd or process_vm_* only processes in the same domain or one nested in it, so what an
 * earlier command left running cannot reach into a later command (a grader's, say) to read its
 * input or forge its output and exit status; same-uid root inside the sandbox no longer decides.
 *
 * With --cgroup-fd FD NAME it first moves itself into the command's own cgroup (a cgroup2
 * directory NAME with no controllers, under the sandbox's), so that the command and everything it
 * ever starts are in it from their first instruction: the edge ends a timed-out command with
 * cgroup.kill, which nothing inside can leave or hide from (an environment tag could be dropped;
 * a double fork leaves the process tree). FD is that cgroup's cgroup.procs, opened for writing on
 * the host and handed in by `crun exec --preserve-fds`: cgroupfs is read-only inside, but the
 * kernel checks a migration against the credentials and cgroup namespace of whoever *opened* the
 * file (since 5.16), so writing "0" to it moves this process without a round trip to the edge.
 * The fd is closed before anything else runs, and the move is checked in /proc/self/cgroup.
 *
 * It fails closed: a kernel without Landlock, a missing PATH or any failed step ends with exit
 * status 126 and a message on stderr, never with the command running unrestricted.
 *
 * The Landlock ABI is stable, so its few constants and system call numbers are spelt out here
 * rather than taken from the build machine's headers, which may be older than the kernel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SYS_landlock_create_ruleset_ 444
#define SYS_landlock_add_rule_ 445
#define SYS_landlock_restrict_self_ 446
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#define LANDLOCK_RULE_PATH_BENEATH 1

#define FS_WRITE_FILE (1ULL << 1)
#define FS_REMOVE_DIR (1ULL << 4)
#define FS_REMOVE_FILE (1ULL << 5)
#define FS_MAKE_CHAR (1ULL << 6)
#define FS_MAKE_DIR (1ULL << 7)
#define FS_MAKE_REG (1ULL << 8)
#define FS_MAKE_SOCK (1ULL << 9)
#define FS_MAKE_FIFO (1ULL << 10)
#define FS_MAKE_BLOCK (1ULL << 11)
#define FS_MAKE_SYM (1ULL << 12)
#define FS_REFER (1ULL << 13)    /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14) /* ABI 3 */

/* What a command may do to a file it does not create or remove: only these apply to files. */
#define FILE_CHANGES (FS_WRITE_FILE | FS_TRUNCATE)

#define SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

struct ruleset_attr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net; /* ABI 4 */
  uint64_t scoped;             /* ABI 6 */
};

/* The standard character devices a confined command may still write (and truncate) but never
 * remove, replace or rename: `eval ... </dev/null` must keep reading nothing and /dev/urandom
 * must stay random whatever a confined agent tries. */
static const char *const DEV_FILES[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"};
/* Directories under /dev a command needs to create in: shared memory, terminals, queues. */
static const char *const DEV_DIRS[] = {"/dev/shm", "/dev/pts", "/dev/mqueue"};

struct path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

static int fail(const char *what, const char *detail) {
  if (detail)
    fprintf(stderr, "dsec-landlock: %s %s: %s\n", what, detail, strerror(errno));
  else
    fprintf(stderr, "dsec-landlock: %s\n", what);
  return 126;
}

static int allow_beneath(int ruleset, const char *path, uint64_t handled) {
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return -1;
  }
  struct path_beneath_attr rule = {
      .allowed_access = S_ISDIR(st.st_mode) ? handled : (handled & FILE_CHANGES),
      .parent_fd = fd,
  };
  long r = syscall(SYS_landlock_add_rule_, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  close(fd);
  return r == 0 ? 0 : -1;
}

/* Whether this process's cgroup2 path (the "0::" line of /proc/self/cgroup) ends in "/NAME". */
static int in_cgroup(const char *name) {
  char buf[4096];
  int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *line = strstr(buf, "0::");
  if (line != buf && (line == NULL || line[-1] != '\n')) return 0;
  char *end = strchr(line, '\n');
  if (end) *end = 0;
  size_t len = strlen(line), nlen = strlen(name);
  return len > nlen + 3 && line[len - nlen - 1] == '/' && strcmp(line + len - nlen, name) == 0;
}

/*
 * Moves this process into its command cgroup through `fd` (that cgroup's cgroup.procs, opened by
 * the edge) and closes it, so the command never holds it. Fails closed: unless /proc/self/cgroup
 * then names the cgroup, the command does not run.
 */
static int join_cgroup(int fd, const char *name) {
  ssize_t w = write(fd, "0", 1);
  int saved = errno;
  close(fd);
  errno = saved;
  if (w != 1) return -1;
  return in_cgroup(name) ? 0 : -2;
}

/* What a shell prints when a command cannot be run, and its exit status (127: not found, 126:
 * found but not runnable): an agent's observation must look like plain Linux, with no helper's
 * name in it. */
static int exec_failed(const char *cmd) {
  int err = errno;
  if (err == ENOENT && !strchr(cmd, '/')) fprintf(stderr, "%s: command not found\n", cmd);
  else fprintf(stderr, "%s: %s\n", cmd, strerror(err));
  return err == ENOENT ? 127 : 126;
}

int main(int argc, char **argv) {
  int i = 1;
  if (i + 2 < argc && strcmp(argv[i], "--cgroup-fd") == 0) {
    char *end;
    long fd = strtol(argv[i + 1], &end, 10);
    if (*end != 0 || fd < 3 || fd > 1024) return fail("--cgroup-fd takes a file descriptor (3 or above) and a cgroup's name", NULL);
    if (strchr(argv[i + 2], '/') != NULL || argv[i + 2][0] == 0) return fail("--cgroup-fd takes a file descriptor and a cgroup's name", NULL);
    int joined = join_cgroup((int)fd, argv[i + 2]);
    if (joined == -1) return fail("cannot move this command into its cgroup", argv[i + 2]);
    if (joined != 0) return fail("the command is not in its cgroup after the move; refusing to run it", NULL);
    i += 3;
  }
  long abi = syscall(SYS_landlock_create_ruleset_, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return fail("this kernel has no usable Landlock; refusing to run the command unrestricted", NULL);

  if (i < argc && strcmp(argv[i], "--isolate") == 0) {
    /*
     * A domain of its own that changes nothing else: block devices are useless in a sandbox (the
     * device cgroup) anyway. Every Landlock domain refuses linking or renaming across directories
     * unless REFER is granted, so it is granted beneath / (ABI 2 and later; the edge does not
     * isolate on older kernels).
     */
    if (abi < 2) return fail("--isolate needs Landlock ABI 2 (REFER)", NULL);
    struct ruleset_attr attr = {.handled_access_fs = FS_MAKE_BLOCK | FS_REFER};
    int ruleset = (int)syscall(SYS_landlock_create_ruleset_, &attr, sizeof attr, 0);
    if (ruleset < 0) return fail("landlock_create_ruleset", "");
    int root = open("/", O_PATH | O_CLOEXEC);
    struct path_beneath_attr everywhere = {.allowed_access = FS_REFER, .parent_fd = root};
    if (root < 0 || syscall(SYS_landlock_add_rule_, ruleset, LANDLOCK_RULE_PATH_BENEATH, &everywhere, 0) != 0) return fail("cannot allow", "REFER beneath /");
    close(root);
    if (i + 2 >= argc || strcmp(argv[i + 1], "--") != 0) return fail("usage: dsec-landlock --isolate -- CMD [ARG]...", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("prctl(PR_SET_NO_NEW_PRIVS)", "");
    if (syscall(SYS_landlock_restrict_self_, ruleset, 0) != 0) return fail("landlock_restrict_self", "");
    close(ruleset);
    execvp(argv[i + 2], &argv[i + 2]);
    return exec_failed(argv[i + 2]);
  }

  uint64_t handled = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG |
                     FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM;
  if (abi >= 2) handled |= FS_REFER;
  if (abi >= 3) handled |= FS_TRUNCATE;

  /* From ABI 6 the domain is also scoped: no signal to a process outside it (SIGSTOP to a
   * grader, say) and no connecting to an abstract unix socket made outside it. */
  struct ruleset_attr attr = {.handled_access_fs = handled, .scoped = abi >= 6 ? SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL : 0};
  size_t attr_size = abi >= 6 ? sizeof attr : sizeof attr.handled_access_fs;
  int ruleset = (int)syscall(SYS_landlock_create_ruleset_, &attr, attr_size, 0);
  if (ruleset < 0) return fail("landlock_create_ruleset", "");

  /* /dev is the sandbox's own tmpfs: its standard nodes stay writable, never replaceable. */
  for (size_t d = 0; d < sizeof DEV_FILES / sizeof *DEV_FILES; d++) {
    if (allow_beneath(ruleset, DEV_FILES[d], handled) != 0 && errno != ENOENT) return fail("cannot allow", DEV_FILES[d]);
  }
  for (size_t d = 0; d < sizeof DEV_DIRS / sizeof *DEV_DIRS; d++) {
    if (allow_beneath(ruleset, DEV_DIRS[d], handled) != 0 && errno != ENOENT) return fail("cannot allow", DEV_DIRS[d]);
  }
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    if (strcmp(argv[i], "--rw") != 0 || i + 1 >= argc) return fail("usage: dsec-landlock --rw PATH... -- CMD [ARG]...", NULL);
    i++;
    if (allow_beneath(ruleset, argv[i], handled) != 0) return fail("cannot allow writes beneath", argv[i]);
  }
  if (i + 1 >= argc) return fail("usage: dsec-landlock --rw PATH... -- CMD [ARG]...", NULL);

  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("prctl(PR_SET_NO_NEW_PRIVS)", "");
  if (syscall(SYS_landlock_restrict_self_, ruleset, 0) != 0) return fail("landlock_restrict_self", "");
  close(ruleset);

  execvp(argv[i + 1], &argv[i + 1]);
  return exec_failed(argv[i + 1]);
}
