/*
 * dsec-landlock: restrict where a command may change files, then become that command.
 *
 *   dsec-landlock [--cgroup-fd FD NAME] --rw PATH [--rw PATH]... -- CMD [ARG]...
 *   dsec-landlock [--cgroup-fd FD NAME] --isolate -- CMD [ARG]...
 *
 * The edge bind-mounts this static binary into every sandbox (read-only, on /dev's tmpfs, like
 * the init) and puts it in front of a command's argv when the request names writable paths.
 * It puts itself in the command's Landlock domain (landlock-domain.c: with --rw, files may change
 * only beneath each PATH; with --isolate, a domain of its own that changes no file right that
 * matters) and execs the command: the restriction holds for the command and all its descendants,
 * and nothing of dsec stays resident. Commands started by the edge's own starter (enter-core.c)
 * get the same domain without this binary; it is what `crun exec` (terminals, sandboxes whose
 * filter crun compiled itself) and the function zygote run through.
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
 */
#define _GNU_SOURCE
#include "landlock-domain.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what, const char *detail) {
  if (detail)
    fprintf(stderr, "dsec-landlock: %s %s: %s\n", what, detail, strerror(errno));
  else
    fprintf(stderr, "dsec-landlock: %s\n", what);
  return 126;
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
  int isolate = i < argc && strcmp(argv[i], "--isolate") == 0;
  char *rw[4096];
  int nrw = 0;
  if (isolate) {
    if (i + 2 >= argc || strcmp(argv[i + 1], "--") != 0) return fail("usage: dsec-landlock --isolate -- CMD [ARG]...", NULL);
    i++;
  } else {
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
      if (strcmp(argv[i], "--rw") != 0 || i + 1 >= argc || nrw == 4096) return fail("usage: dsec-landlock --rw PATH... -- CMD [ARG]...", NULL);
      rw[nrw++] = argv[++i];
    }
    if (i + 1 >= argc) return fail("usage: dsec-landlock --rw PATH... -- CMD [ARG]...", NULL);
  }
  char why[512];
  if (landlock_domain(isolate, rw, nrw, why, sizeof why) != 0) return fail(why, NULL);
  execvp(argv[i + 1], &argv[i + 1]);
  return exec_failed(argv[i + 1]);
}
