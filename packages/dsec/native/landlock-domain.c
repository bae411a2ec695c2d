/*
 * The Landlock domain of a command (landlock-domain.h): what `dsec-landlock --isolate` and
 * `dsec-landlock --rw PATH...` apply before they exec the command, and what the command starter
 * (enter-core.c) applies in the command's own process, so that there is one definition of it.
 *
 * It creates a ruleset that handles every kind of filesystem change (write, truncate, create,
 * remove, rename/link across directories), allows them beneath each PATH, on /dev's standard nodes
 * (write only) and beneath /dev/shm, /dev/pts and /dev/mqueue, and applies it to this process: the
 * restriction holds for the command and all its descendants. Reading and executing stay allowed.
 *
 * `isolate` changes no file right that matters (it only refuses making block device nodes) but
 * still puts the command in a Landlock domain of its own. Every command starts that way: Landlock
 * lets a process in a domain ptrace, read /proc/<pid>/mem or fd/, pidfd_getfd or process_vm_* only
 * processes in the same domain or one nested in it, so what an earlier command left running cannot
 * reach into a later command (a grader's, say) to read its input or forge its output and exit
 * status; same-uid root inside the sandbox no longer decides.
 *
 * The Landlock ABI is stable, so its few constants and system call numbers are spelt out here
 * rather than taken from the build machine's headers, which may be older than the kernel.
 */
#define _GNU_SOURCE
#include "landlock-domain.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
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

struct path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

/* The standard character devices a confined command may still write (and truncate) but never
 * remove, replace or rename: `eval ... </dev/null` must keep reading nothing and /dev/urandom
 * must stay random whatever a confined agent tries. */
static const char *const DEV_FILES[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"};
/* Directories under /dev a command needs to create in: shared memory, terminals, queues. */
static const char *const DEV_DIRS[] = {"/dev/shm", "/dev/pts", "/dev/mqueue"};

static int failed(char *why, size_t size, const char *what, const char *detail, int with_errno) {
  int saved = errno;
  if (with_errno) snprintf(why, size, "%s%s%s: %s", what, detail ? " " : "", detail ? detail : "", strerror(saved));
  else snprintf(why, size, "%s", what);
  return -1;
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

/* Applies `ruleset` to this process (no_new_privs first: Landlock requires it) and closes it. */
static int restrict_self(int ruleset, char *why, size_t size) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return failed(why, size, "prctl(PR_SET_NO_NEW_PRIVS)", NULL, 1);
  if (syscall(SYS_landlock_restrict_self_, ruleset, 0) != 0) return failed(why, size, "landlock_restrict_self", NULL, 1);
  close(ruleset);
  return 0;
}

int landlock_domain(int isolate, char *const *rw, int nrw, char *why, size_t size) {
  long abi = syscall(SYS_landlock_create_ruleset_, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return failed(why, size, "this kernel has no usable Landlock; refusing to run the command unrestricted", NULL, 0);

  if (isolate) {
    /*
     * A domain of its own that changes nothing else: block devices are useless in a sandbox (the
     * device cgroup) anyway. Every Landlock domain refuses linking or renaming across directories
     * unless REFER is granted, so it is granted beneath / (ABI 2 and later; the edge does not
     * isolate on older kernels).
     */
    if (abi < 2) return failed(why, size, "--isolate needs Landlock ABI 2 (REFER)", NULL, 0);
    struct ruleset_attr attr = {.handled_access_fs = FS_MAKE_BLOCK | FS_REFER};
    int ruleset = (int)syscall(SYS_landlock_create_ruleset_, &attr, sizeof attr, 0);
    if (ruleset < 0) return failed(why, size, "landlock_create_ruleset", NULL, 1);
    int root = open("/", O_PATH | O_CLOEXEC);
    struct path_beneath_attr everywhere = {.allowed_access = FS_REFER, .parent_fd = root};
    if (root < 0 || syscall(SYS_landlock_add_rule_, ruleset, LANDLOCK_RULE_PATH_BENEATH, &everywhere, 0) != 0)
      return failed(why, size, "cannot allow", "REFER beneath /", 1);
    close(root);
    return restrict_self(ruleset, why, size);
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
  if (ruleset < 0) return failed(why, size, "landlock_create_ruleset", NULL, 1);

  /* /dev is the sandbox's own tmpfs: its standard nodes stay writable, never replaceable. */
  for (size_t d = 0; d < sizeof DEV_FILES / sizeof *DEV_FILES; d++) {
    if (allow_beneath(ruleset, DEV_FILES[d], handled) != 0 && errno != ENOENT) return failed(why, size, "cannot allow", DEV_FILES[d], 1);
  }
  for (size_t d = 0; d < sizeof DEV_DIRS / sizeof *DEV_DIRS; d++) {
    if (allow_beneath(ruleset, DEV_DIRS[d], handled) != 0 && errno != ENOENT) return failed(why, size, "cannot allow", DEV_DIRS[d], 1);
  }
  for (int i = 0; i < nrw; i++) {
    if (allow_beneath(ruleset, rw[i], handled) != 0) return failed(why, size, "cannot allow writes beneath", rw[i], 1);
  }
  return restrict_self(ruleset, why, size);
}
