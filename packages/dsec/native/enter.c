/*
 * dsec-enter: start a command in a running container sandbox, as `crun exec` does, without crun.
 *
 *   dsec-enter --pid PID --cgroup /dsec/ID --spec FILE [--pid-file FILE] --uid UID --gid GID
 *              --cwd DIR --caps MASK --nofile N [--seccomp FILE] [--preserve-fds N]
 *              [--landlock isolate|rw [--rw PATH]...] --cgroup-dir DIR [--cgroup-dir DIR]...
 *
 * The command's argv and environment are read from FILE (mode 0600, so that the environment,
 * which may hold secrets, is never on a command line): `<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...`.
 * Everything else is enter-core.c, which the edge's own path runs in a fork of dsec-spawn (its
 * `enter` request, spawn-enter.c) without this binary's exec. This binary is the same steps as a
 * tool of its own: a start by hand, and the tests that drive the checks with inputs the edge
 * never gives (a pid that is not the sandbox's init, another cgroup).
 *
 * Failures before the command runs end with exit status 255 and a message on stderr, as crun
 * exec's do. The tty case (a terminal for the command) is not handled here: crun exec does it.
 */
#define _GNU_SOURCE
#include "enter-core.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_SPEC (4 << 20)

int main(int argc, char **argv) {
  struct enter_options o;
  enter_parse(argc, argv, &o);
  if (!o.spec) {
    fprintf(stderr, "dsec-enter: --spec FILE is required\n");
    return ENTER_FAILED;
  }
  size_t len, off = 0;
  char *spec = enter_slurp(o.spec, MAX_SPEC, &len, "cannot read the spec file");
  char **args = enter_strings(spec, len, &off, "argv");
  char **env = enter_strings(spec, len, &off, "environment");
  return enter_run(&o, args, env, NULL);
}
