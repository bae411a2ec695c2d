/*
 * The sandboxes dsec-spawn has prepared for `enter` requests (spawn-sandboxes.h): what every
 * command's start in a sandbox needs of it, opened and checked once, at the sandbox's first command,
 * instead of by every command's starter: the init's pidfd (checked to be pid 1 of its pid namespace
 * and in the sandbox's cgroup), the namespaces to join, the cgroup.procs of the sandbox's cgroup in
 * each hierarchy, the seccomp program, /dev/null and cap_last_cap (enter-core.h struct
 * enter_sandbox). Those reads and opens were 0.25 ms of every command's start on the 2-core host
 * dsec is benchmarked on (11 cgroup hierarchies, 14 stats of namespace files, 3 /proc reads).
 *
 * A prepared sandbox is as good as a fresh one: its pidfd is the init's, and a pidfd never follows
 * a recycled pid, so the starter's check that the init still runs (pidfd_send_signal 0) is the
 * check a fresh preparation makes; the files were opened as host root before any namespace was
 * joined, as a fresh starter opens them; a sandbox's cgroups that are gone fail the starter's
 * write, and the command does not run. It is dropped when its init exits (the pidfd polls
 * readable), and the least recently used one when more are kept than the fd limit leaves room for.
 * A sandbox that cannot be prepared here is not kept: its starter prepares it itself and fails
 * with the reason, as before.
 */
#define _GNU_SOURCE
#include "spawn-sandboxes.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

struct kept {
  char *key;
  unsigned long hash;
  unsigned long long used;
  struct enter_sandbox s;
};

static struct kept *kept;
static int nkept, room = -1;
static unsigned long long clock_;

/* The most kept at once: each holds its cgroup files (11 on the host dsec runs on), a pidfd and /dev/null. */
static int capacity(void) {
  if (room >= 0) return room;
  struct rlimit r;
  long soft = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY ? (long)r.rlim_cur : 1024;
  /* Half the limit for them at most: the pipes of the commands running, and other tools', need the rest. */
  long n = soft / 2 / (ENTER_MAX_CGROUP_DIRS / 4);
  room = (int)(n < 0 ? 0 : n > SPAWN_MAX_SANDBOXES ? SPAWN_MAX_SANDBOXES : n);
  kept = calloc((size_t)room + 1, sizeof *kept);
  if (!kept) room = 0;
  return room;
}

static unsigned long fnv(const char *s) {
  unsigned long h = 1469598103934665603UL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211UL;
  return h;
}

/* Moves fd to 16 or above (close-on-exec): the fds a starter's plan dup2s into are below MAX_STREAM_FDS. */
static int high(int fd) {
  if (fd < 0 || fd >= 16) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 16);
  close(fd);
  return moved;
}

static void drop(int i) {
  enter_sandbox_close(&kept[i].s);
  free(kept[i].key);
  kept[i] = kept[--nkept];
}

const struct enter_sandbox *spawn_sandbox_for(char **options, int count) {
  if (capacity() == 0) return NULL;
  char *argv[2 * (ENTER_MAX_CGROUP_DIRS + ENTER_MAX_RW + 32) + 2];
  if (count + 1 >= (int)(sizeof argv / sizeof *argv)) return NULL;
  argv[0] = "enter";
  memcpy(argv + 1, options, (size_t)count * sizeof *options);
  argv[count + 1] = NULL;
  struct enter_options o;
  char why[1024];
  /* A malformed request: its starter says why. */
  if (enter_parse_options(count + 1, argv, &o, why, sizeof why) != 0) return NULL;
  /* The sandbox: its init, its cgroup, its seccomp program and its cgroups (not the command's own). */
  size_t len = 64 + strlen(o.cgroup) + (o.seccomp ? strlen(o.seccomp) : 0);
  for (int i = 0; i < o.ncgroup_dirs; i++) len += strlen(o.cgroup_dirs[i]) + 1;
  char *key = malloc(len);
  if (!key) return NULL;
  size_t n = (size_t)snprintf(key, len, "%ld\n%s\n%s", o.pid, o.cgroup, o.seccomp ? o.seccomp : "");
  for (int i = 0; i < o.ncgroup_dirs; i++) n += (size_t)snprintf(key + n, len - n, "\n%s", o.cgroup_dirs[i]);
  unsigned long hash = fnv(key);
  for (int i = 0; i < nkept; i++) {
    if (kept[i].hash != hash || strcmp(kept[i].key, key) != 0) continue;
    free(key);
    kept[i].used = ++clock_;
    return &kept[i].s;
  }
  if (nkept == room) {
    int oldest = 0;
    for (int i = 1; i < nkept; i++)
      if (kept[i].used < kept[oldest].used) oldest = i;
    drop(oldest);
  }
  struct kept *k = &kept[nkept];
  if (enter_prepare(&o, &k->s, why, sizeof why) != 0) {
    free(key);
    return NULL;
  }
  k->s.pidfd = high(k->s.pidfd);
  k->s.null_fd = high(k->s.null_fd);
  int ok = k->s.pidfd >= 0 && k->s.null_fd >= 0;
  for (int i = 0; i < k->s.ncgroups; i++) ok &= (k->s.cgroup_fds[i] = high(k->s.cgroup_fds[i])) >= 0;
  if (!ok) {
    enter_sandbox_close(&k->s);
    free(key);
    return NULL;
  }
  k->key = key;
  k->hash = hash;
  k->used = ++clock_;
  nkept++;
  return &k->s;
}

int spawn_sandboxes_poll(struct pollfd *pfd, int max) {
  int n = 0;
  for (int i = 0; i < nkept && n < max; i++) pfd[n++] = (struct pollfd){ .fd = kept[i].s.pidfd, .events = POLLIN };
  return n;
}

void spawn_sandboxes_ended(const struct pollfd *pfd, int n) {
  /* Back to front: drop() moves the last one into the hole. */
  for (int i = n - 1; i >= 0; i--) {
    if (!pfd[i].revents) continue;
    for (int k = 0; k < nkept; k++) {
      if (kept[k].s.pidfd == pfd[i].fd) {
        drop(k);
        break;
      }
    }
  }
}

int spawn_sandbox_fds(const struct enter_sandbox *s, int *fds, int max) {
  int n = 0;
  if (!s) return 0;
  if (n < max) fds[n++] = s->pidfd;
  if (n < max) fds[n++] = s->null_fd;
  for (int i = 0; i < s->ncgroups && n < max; i++) fds[n++] = s->cgroup_fds[i];
  return n;
}
