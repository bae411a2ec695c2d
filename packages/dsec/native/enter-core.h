/*
 * Starting a command in a running container sandbox as `crun exec` does, without crun
 * (enter-core.c): shared by dsec-spawn's `enter` request (spawn-enter.c, the edge's path) and the
 * dsec-enter binary (enter.c), so that both make the same checks in the same order.
 */
#ifndef DSEC_ENTER_CORE_H
#define DSEC_ENTER_CORE_H
#include <stddef.h>

#define ENTER_FAILED 255
#define ENTER_MAX_CGROUP_DIRS 64
#define ENTER_MAX_RW 256

/* The Landlock domain the command starts in (landlock-domain.c), if any. */
enum enter_landlock { ENTER_LANDLOCK_NONE, ENTER_LANDLOCK_ISOLATE, ENTER_LANDLOCK_RW };

struct enter_options {
  long pid, uid, gid, nofile, preserve;
  unsigned long long caps;
  const char *cgroup, *spec, *pid_file, *cwd, *seccomp;
  const char *cgroup_dirs[ENTER_MAX_CGROUP_DIRS];
  int ncgroup_dirs;
  enum enter_landlock landlock;
  char *rw[ENTER_MAX_RW];
  int nrw;
};

/* How errors begin ("dsec-enter", "dsec-spawn"). */
extern const char *enter_name;

/* Parses `--flag value` pairs into o (exits 255 on a malformed one); `--spec` is left to the caller to require. */
void enter_parse(int argc, char **argv, struct enter_options *o);

/* `<count>\0<string>\0...` at *off in buf: a NULL-terminated array pointing into buf (exits 255 when malformed). */
char **enter_strings(char *buf, size_t len, size_t *off, const char *what);

/* A whole small file, NUL-terminated (exits 255 when it cannot be read). */
char *enter_slurp(const char *path, size_t max, size_t *len, const char *what);

/*
 * Starts args (with env) in the sandbox whose init o->pid is, with this process's fds 0..2 and
 * the o->preserve fds after them as the command's, waits for it and returns its status (128 + the
 * signal's number when a signal ended it). Never returns in the command. Exits 255 with a
 * message on stderr when the command cannot be started.
 */
int enter_run(const struct enter_options *o, char **args, char **env);

#endif
