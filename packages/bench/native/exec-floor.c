/*
 * exec-floor PID CMD [ARG...]: the kernel's floor for running a command in a running container,
 * for `dsec bench exec` to report beside dsec and raw `crun exec`: enter every namespace of the
 * container's init process PID that differs from ours in one setns(2) on a pidfd (Linux 5.8+),
 * fork (so the child is in the PID namespace), exec CMD, wait, and exit with its status.
 * Nothing else: no cgroup move, no capabilities, seccomp, Landlock or rlimits, no output
 * plumbing beyond the inherited fds. That is what makes it a floor, not a way to run commands.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Whether namespace `ns` of `pid` is another one than ours (setns refuses our own user namespace). */
static int differs(const char *pid, const char *ns) {
  char theirs[64], ours[64];
  struct stat a, b;
  snprintf(theirs, sizeof theirs, "/proc/%s/ns/%s", pid, ns);
  snprintf(ours, sizeof ours, "/proc/self/ns/%s", ns);
  if (stat(theirs, &a) != 0 || stat(ours, &b) != 0) return 0;
  return a.st_ino != b.st_ino || a.st_dev != b.st_dev;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PID CMD [ARG...]\n", argv[0]);
    return 2;
  }
  static const struct { const char *name; int flag; } kinds[] = {
    {"user", CLONE_NEWUSER}, {"mnt", CLONE_NEWNS},   {"pid", CLONE_NEWPID},       {"net", CLONE_NEWNET},
    {"ipc", CLONE_NEWIPC},   {"uts", CLONE_NEWUTS}, {"cgroup", CLONE_NEWCGROUP},
  };
  int flags = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (differs(argv[1], kinds[i].name)) flags |= kinds[i].flag;
  int pidfd = (int)syscall(SYS_pidfd_open, atoi(argv[1]), 0);
  if (pidfd < 0) {
    perror("exec-floor: pidfd_open");
    return 1;
  }
  if (flags && setns(pidfd, flags) != 0) {
    perror("exec-floor: setns");
    return 1;
  }
  pid_t child = fork();
  if (child < 0) {
    perror("exec-floor: fork");
    return 1;
  }
  if (child == 0) {
    execvp(argv[2], argv + 2);
    perror("exec-floor: exec");
    _exit(127);
  }
  int status;
  if (waitpid(child, &status, 0) < 0) {
    perror("exec-floor: waitpid");
    return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
