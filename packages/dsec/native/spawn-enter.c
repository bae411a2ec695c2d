/*
 * dsec-spawn's `enter` request (spawn-helper.c): a command started in a running container sandbox
 * by a fork of dsec-spawn itself, which then does what dsec-enter does (enter-core.c) — no spec
 * file, no exec of dsec-enter, no exec of dsec-landlock: the command's own exec is the only one.
 * Each exec of a binary is a few hundred microseconds of a command's start (fork + exec of
 * /bin/true: 0.46 ms on the 2-core host dsec is benchmarked on, where setns + two forks + the
 * command's exec, the kernel's own floor for a command, is 0.87 ms).
 *
 * The request's body after the fd plans and the OOM score (see spawn-helper.c) is
 *
 *   <dsec-enter's options, each `--flag\0value\0`, without --spec>--\0<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...
 *
 * The command's environment, which may hold secrets, travels in the edge's pipe to this process,
 * never on a command line or in a file.
 *
 * The child is a fork of dsec-spawn: it holds copies of the helper's fds (its pipes to the edge,
 * other tools' pipes) and memory (other requests). The fds are closed here before anything else,
 * all but the command's planned ones. The memory is never readable from the sandbox: enter-core
 * makes this process non-dumpable before it joins the sandbox's namespaces, and its mm belongs to
 * the host's user namespace, so no process in the sandbox may ptrace it or open its /proc files;
 * the command's exec replaces the memory of the command's own process.
 */
#define _GNU_SOURCE
#include "spawn-enter.h"
#include "enter-core.h"
#include "spawn-sandboxes.h"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_OPTIONS (2 * (ENTER_MAX_CGROUP_DIRS + ENTER_MAX_RW + 32))

static void fail(const char *text) {
  fprintf(stderr, "dsec-enter: %s\n", text);
  _exit(ENTER_FAILED);
}

/*
 * Its command line, as `ps` and the edge's own listings read it: `dsec-enter` and the options it
 * was given (which sandbox first: its cgroup, init and seccomp program, then the rest as far as
 * they fit), never the command's argv or environment. It would otherwise be dsec-spawn's,
 * saying nothing of what the process is for. The words are written over this fork's copy of the helper's own argv strings
 * (`title`, `room` bytes): moving the kernel's idea of where they are (PR_SET_MM) needs
 * CAP_SYS_RESOURCE, which a host running dsec in a container may not give.
 */
static void show_options(int argc, char **argv, char *title, size_t room) {
  static const char *const first[] = { "--cgroup", "--pid", "--seccomp" };
  if (!title || room < 2) return;
  memset(title, 0, room);
  size_t n = 0;
  const char *word = "dsec-enter";
  memcpy(title, word, strlen(word) + 1);
  n = strlen(word) + 1;
  /* Two passes: the options that say which sandbox, then every other one; pairs whole or not at all. */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 1; i + 1 < argc; i += 2) {
      int early = 0;
      for (size_t f = 0; f < sizeof first / sizeof *first; f++) early |= !strcmp(argv[i], first[f]);
      if (early != (pass == 0)) continue;
      size_t a = strlen(argv[i]) + 1, b = strlen(argv[i + 1]) + 1;
      /* The last byte stays NUL: the kernel reads the area as NUL-separated words only then. */
      if (n + a + b >= room) continue;
      memcpy(title + n, argv[i], a);
      memcpy(title + n + a, argv[i + 1], b);
      n += a + b;
    }
  }
}

/* Closes every fd from `from` up but those in keep[0..n) (each at or above from). */
static void close_all_but(int from, int *keep, int n) {
  /* Sorted, so the gaps between them are ranges. */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  unsigned low = (unsigned)from;
  for (int i = 0; i < n; i++) {
    if ((unsigned)keep[i] > low && syscall(SYS_close_range, low, (unsigned)keep[i] - 1, 0) != 0) fail("close_range");
    low = (unsigned)keep[i] + 1;
  }
  if (syscall(SYS_close_range, low, ~0U, 0) != 0) fail("close_range");
}

void spawn_enter_child(char *req, size_t len, const int *ends, int nfds, const char *null_path, char *title, size_t room, const struct enter_sandbox *prepared) {
  /* As posix_spawn's attributes give a tool: no signal blocked, none ignored (the helper blocks
   * SIGCHLD and ignores SIGPIPE). */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  /* What `ps` and the edge's process listings call it (show_options: its command line too). */
  prctl(PR_SET_NAME, "dsec-enter", 0, 0, 0);

  int null = open(null_path, O_RDWR | O_CLOEXEC);
  int high = null < 0 ? -1 : fcntl(null, F_DUPFD_CLOEXEC, 64);
  if (high < 0) _exit(ENTER_FAILED); /* no stderr of the command's yet to say it on */
  close(null);
  /* The planned ends sit at 64 or above (spawn-helper.c high_pipe), clear of 0..nfds-1. */
  for (int fd = 0; fd < nfds; fd++) {
    if (dup2(ends[fd] >= 0 ? ends[fd] : high, fd) != fd) _exit(ENTER_FAILED);
  }
  /* Everything of the helper's but the planned fds, and the sandbox's prepared files (spawn-sandboxes.c, at 16 or above). */
  int keep[ENTER_MAX_CGROUP_DIRS + 2];
  close_all_but(nfds, keep, spawn_sandbox_fds(prepared, keep, (int)(sizeof keep / sizeof *keep)));

  char *argv[MAX_OPTIONS + 2];
  int argc = 0;
  argv[argc++] = "enter";
  size_t off = 0;
  while (off < len && strcmp(req + off, "--") != 0) {
    if (argc == MAX_OPTIONS + 1) fail("too many options in the enter request");
    argv[argc++] = req + off;
    off += strlen(req + off) + 1;
  }
  if (off >= len) fail("the enter request has no `--` before its argv");
  off += 3;
  argv[argc] = NULL;
  struct enter_options o;
  enter_parse(argc, argv, &o);
  show_options(argc, argv, title, room);
  o.title = title;
  o.title_room = room;
  /* A standby's last fd is the one its command comes on, not one the command keeps. */
  o.preserve = nfds > 3 + o.standby ? nfds - 3 - o.standby : 0;
  char **args = enter_strings(req, len, &off, "argv");
  char **env = enter_strings(req, len, &off, "environment");
  _exit(enter_run(&o, args, env, prepared));
}
