/*
 * Starting a command in a running container sandbox as `crun exec` does, without crun
 * (enter-core.c): shared by dsec-spawn's `enter` request (spawn-enter.c, the edge's path) and the
 * dsec-enter binary (enter.c), so that both make the same checks in the same order.
 */
#ifndef DSEC_ENTER_CORE_H
#define DSEC_ENTER_CORE_H
#include <linux/filter.h>
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
  /* The command's own cgroup (--command-cgroup), right below cgroup_dirs[command_parent], whose place it takes. */
  const char *command_cgroup;
  int command_parent;
  enum enter_landlock landlock;
  char *rw[ENTER_MAX_RW];
  int nrw;
  /* --standby 1: the command is set up but waits for its cwd, argv and environment, read from the
   * fd after the preserved ones (`<cwd>\0<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...`, then end of
   * file), before its exec; end of file with nothing read ends it (status 0). */
  int standby;
  /* The process's command line as `ps` reads it (dsec-spawn's argv strings, `room` bytes), where
   * the caller set one: a standby overwrites it in its own copy (no host paths while it waits). */
  char *title;
  size_t title_room;
};

/*
 * What a command's start needs of its sandbox, opened and checked on the host before any namespace
 * is joined (steps 2 and 3 of enter-core.c): the init's pidfd (checked to be the sandbox's init),
 * the namespaces to join, each --cgroup-dir's cgroup.procs, the seccomp program, /dev/null and the
 * kernel's last capability. enter_run makes one per command, or is given one that dsec-spawn made
 * at the sandbox's first command and keeps while the init lives (spawn-sandboxes.c): a pidfd
 * never follows a recycled pid, so the init it checked is the one still running.
 */
struct enter_sandbox {
  long pid;
  int pidfd, flags, null_fd, last_cap;
  int cgroup_fds[ENTER_MAX_CGROUP_DIRS];
  int ncgroups;
  int has_filter;
  struct sock_fprog filter;
};

/* How errors begin ("dsec-enter", "dsec-spawn"). */
extern const char *enter_name;

/* Parses `--flag value` pairs into o (exits 255 on a malformed one); `--spec` is left to the caller to require. */
void enter_parse(int argc, char **argv, struct enter_options *o);

/* As enter_parse, but says why in `why` and returns -1 instead of exiting. */
int enter_parse_options(int argc, char **argv, struct enter_options *o, char *why, size_t size);

/* Opens and checks what o's sandbox needs (see struct enter_sandbox); -1 and why when it cannot, nothing left open. */
int enter_prepare(const struct enter_options *o, struct enter_sandbox *s, char *why, size_t size);

/* Closes and frees what enter_prepare opened. */
void enter_sandbox_close(struct enter_sandbox *s);

/* `<count>\0<string>\0...` at *off in buf: a NULL-terminated array pointing into buf (exits 255 when malformed). */
char **enter_strings(char *buf, size_t len, size_t *off, const char *what);

/* A whole small file, NUL-terminated (exits 255 when it cannot be read). */
char *enter_slurp(const char *path, size_t max, size_t *len, const char *what);

/*
 * Starts args (with env) in the sandbox whose init o->pid is (`prepared` for it, or NULL to
 * prepare it here), with this process's fds 0..2 and
 * the o->preserve fds after them as the command's, waits for it and returns its status (128 + the
 * signal's number when a signal ended it). Never returns in the command. Exits 255 with a
 * message on stderr when the command cannot be started.
 */
int enter_run(const struct enter_options *o, char **args, char **env, const struct enter_sandbox *prepared);

#endif
