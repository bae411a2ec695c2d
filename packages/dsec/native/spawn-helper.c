/*
 * dsec-spawn: starts host tools (crun, ...) for one edge, resident, so the edge's large Node
 * process does not fork() for each call. A fork of a process with hundreds of MiB mapped copies
 * its page tables and leaves every page it then writes to a copy-on-write fault, which slows the
 * edge's next request; this process is small and starts each tool with posix_spawn (vfork
 * semantics in glibc: no page tables copied).
 *
 * Requests on stdin, any number in flight:
 *
 *   <id> <stdio> <length>\n<length bytes: the argv, each argument NUL-terminated>
 *
 * <stdio> is `ignore` (stdin, stdout and stderr all /dev/null: a tool that leaves a detached
 * process behind, as `crun run -d` leaves the container, must not hand it a pipe of ours) or
 * `pipe` (stdout and stderr collected, up to 1 MiB each). argv[0] is looked up in PATH.
 * Answers on stdout, in the order the tools finish:
 *
 *   <id> <status> <stdout length> <stderr length>\n<stdout bytes><stderr bytes>
 *
 * <status> is the exit code, 128 + the signal's number when a signal ended the tool, or 127
 * when it could not be started (the reason in its stderr). Answered once the tool has exited and
 * its pipes are closed. The helper exits when its stdin closes; tools still running are left to
 * finish (they are reparented, as they would be if the edge itself had died).
 *
 * <stdio> `stream` is for a tool whose stdio the edge reads and writes itself as it runs (`crun
 * exec`: a command's output streamed to its caller). The body is then
 *
 *   <n>\0<fd 0's plan>\0...<fd n-1's plan>\0<oom_score_adj or ->\0<the argv, as above>
 *
 * and each plan is `null` (/dev/null), `in` (a pipe the edge writes), `out` (a pipe the edge
 * reads), `w:PATH` (PATH opened for writing in the tool, as a command's cgroup.procs is for
 * `crun exec --preserve-fds`) or `d:HEX` (a pipe that holds those bytes, at most 32 KiB, and
 * then its end: a command's whole stdin, written here before the tool starts). An oom_score_adj is set for the tool as a privileged write (so
 * that it, and the command crun exec starts, cannot lower it again), the helper's own restored
 * after the spawn. The edge cannot receive file descriptors (Node has no SCM_RIGHTS),
 * so the helper makes the pipes, keeps the edge's ends open and says where:
 *
 *   <id> started <pid> <fd>...\n           one helper fd per planned fd, -1 where no pipe
 *
 * The edge opens /proc/<helper>/fd/<fd> for each (opening a pipe there opens that same pipe) and
 * sends `<id> release 0\n`, and only then does the helper close its ends; until then they keep
 * the pipes alive, so no byte written by a command that ends at once is lost. `<id> kill <length>\n<signal>`
 * signals the tool while it has not been reaped (never a recycled pid). When it exits: the usual
 * `<id> <status> 0 0\n`. A tool that cannot start is answered as above (127 and why), without
 * `started`.
 *
 * <stdio> `enter` starts a command in a running container sandbox without a tool: a fork of this
 * process becomes the command's starter and does what dsec-enter does (spawn-enter.c,
 * enter-core.c). The body is a `stream` body whose argv is replaced by the enter request
 * (spawn-enter.c); the answers are a stream tool's (`started` with the starter's pid, `release`,
 * `kill`, the command's status).
 *
 * <stdio> `carry` starts a tool as `ignore` or `pipe` does, but in a mount namespace of its own
 * made from a small template instead of the edge's (`crun run -d`; see make_template). The body is
 *
 *   <ignore or pipe>\0<n>\0<dir 1>\0...<dir n>\0<the argv, as above>
 *
 * and each dir, with every mount below it, is carried from the edge's namespace to the same path
 * in the tool's. When that cannot be done the tool is not started: 127, and a stderr that begins
 * `dsec-spawn: cannot carry` (the edge then starts it as before).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "spawn-enter.h"
#include "spawn-sandboxes.h"

extern char **environ;

/* A request's body: an `enter` request carries the command's argv and environment, which the
 * kernel's exec takes up to a quarter of the stack limit (2 MiB at 8 MiB); the edge refuses
 * longer requests before they are sent (host/spawn-helper.ts), as a longer one ends this helper. */
#define MAX_REQUEST (4 << 20)
#define MAX_OUTPUT (1 << 20)
/* Tools running at once: every command's crun exec is one while the command runs (a node holds
 * thousands of sandboxes, each with background processes), so this is well above any node's. */
#define MAX_CHILDREN 16384
#define MAX_STREAM_FDS 8

struct buffer {
  char *data;
  size_t len;
};

struct child {
  unsigned long long id;
  pid_t pid; /* 0 once reaped */
  int status;
  int fds[2]; /* stdout, stderr read ends; -1 once closed */
  struct buffer out[2];
  int stream;                  /* a `stream` tool: the edge holds its pipes */
  int held[2 * MAX_STREAM_FDS]; /* a stream tool's pipe ends kept open until `release`; -1 when none */
  int released;
  int answered;                /* its exit was answered */
};

/* What a "null" stdio opens (--null PATH; default the host's /dev/null). */
static const char *null_path = "/dev/null";

/* This process's argv strings (contiguous), where a command's starter writes its own command line. */
static char *title;
static size_t title_room;

static struct child children[MAX_CHILDREN];
static int nchildren;

static void append(struct buffer *b, const char *data, size_t n) {
  if (b->len >= MAX_OUTPUT) return;
  if (n > MAX_OUTPUT - b->len) n = MAX_OUTPUT - b->len;
  char *grown = realloc(b->data, b->len + n);
  if (!grown) return;
  b->data = grown;
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

static void write_all(const char *data, size_t n) {
  while (n > 0) {
    ssize_t w = write(STDOUT_FILENO, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      exit(1); /* the edge is gone */
    }
    data += w;
    n -= (size_t)w;
  }
}

static void answer(unsigned long long id, int status, const struct buffer *out, const struct buffer *err) {
  char head[96];
  int n = snprintf(head, sizeof head, "%llu %d %zu %zu\n", id, status, out->len, err->len);
  write_all(head, (size_t)n);
  write_all(out->data ? out->data : "", out->len);
  write_all(err->data ? err->data : "", err->len);
}

/* Answers and forgets the children that have exited and whose pipes are closed. */
static void finish_done(void) {
  for (int i = 0; i < nchildren;) {
    struct child *c = &children[i];
    if (c->stream && c->pid == 0 && !c->answered) {
      struct buffer none = { 0 };
      answer(c->id, c->status, &none, &none);
      c->answered = 1;
    }
    if (c->stream ? (c->answered && c->released) : (c->pid == 0 && c->fds[0] < 0 && c->fds[1] < 0)) {
      if (!c->stream) answer(c->id, c->status, &c->out[0], &c->out[1]);
      free(c->out[0].data);
      free(c->out[1].data);
      children[i] = children[--nchildren];
    } else {
      i++;
    }
  }
}

/* A tool starts with no signal blocked and every handler at its default, whatever ours are. */
static void init_spawn_attr(posix_spawnattr_t *attr) {
  posix_spawnattr_init(attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(attr, &empty);
  posix_spawnattr_setsigdefault(attr, &all);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

/* Records a started tool (its stdout and stderr read ends, -1 where the edge holds them). */
static struct child *track(unsigned long long id, pid_t pid, int out, int err) {
  struct child *c = &children[nchildren++];
  memset(c, 0, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->fds[0] = out;
  c->fds[1] = err;
  return c;
}

/* Splits a request body of NUL-terminated strings into `fields`: at most max - 1, then NULL. */
static int split_fields(char *body, size_t len, char **fields, int max) {
  int n = 0;
  for (size_t off = 0; off < len && n < max - 1;) {
    fields[n++] = body + off;
    off += strlen(body + off) + 1;
  }
  fields[n] = NULL;
  return n;
}

static void start(unsigned long long id, int piped, char *args, size_t len) {
  char *argv[4096];
  int argc = split_fields(args, len, argv, 4096);
  struct buffer none = { 0 };
  if (argc == 0 || nchildren == MAX_CHILDREN) {
    struct buffer why = { .data = argc == 0 ? "dsec-spawn: empty argv" : "dsec-spawn: too many tools running" };
    why.len = strlen(why.data);
    answer(id, 127, &none, &why);
    return;
  }
  int out[2] = { -1, -1 }, err[2] = { -1, -1 };
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, null_path, O_RDONLY, 0);
  if (piped && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
    char text[128];
    snprintf(text, sizeof text, "dsec-spawn: pipe: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
      if (out[i] >= 0) close(out[i]);
      if (err[i] >= 0) close(err[i]);
    }
    posix_spawn_file_actions_destroy(&fa);
    struct buffer why = { .data = text, .len = strlen(text) };
    answer(id, 127, &none, &why);
    return;
  }
  if (piped) {
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, null_path, O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, null_path, O_WRONLY, 0);
  }
  posix_spawnattr_t attr;
  init_spawn_attr(&attr);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (out[1] >= 0) close(out[1]);
  if (err[1] >= 0) close(err[1]);
  if (rc != 0) {
    if (out[0] >= 0) close(out[0]);
    if (err[0] >= 0) close(err[0]);
    char text[512];
    snprintf(text, sizeof text, "cannot start %s: %s", argv[0], strerror(rc));
    struct buffer why = { .data = text, .len = strlen(text) };
    answer(id, 127, &none, &why);
    return;
  }
  track(id, pid, out[0], err[0]);
}


/* This process's own oom_score_adj, read at start and restored after each tool given another. */
static char own_oom_score_adj[16] = "0";

static int set_oom_score_adj(const char *value) {
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, value, strlen(value));
  int saved = errno;
  close(fd);
  errno = saved;
  return n == (ssize_t)strlen(value) ? 0 : -1;
}

static void read_own_oom_score_adj(void) {
  int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, own_oom_score_adj, sizeof own_oom_score_adj - 1);
  close(fd);
  if (n <= 0) n = 0;
  own_oom_score_adj[n] = 0;
  char *nl = strchr(own_oom_score_adj, '\n');
  if (nl) *nl = 0;
  if (own_oom_score_adj[0] == 0) strcpy(own_oom_score_adj, "0");
}

static void close_held(struct child *c) {
  for (int i = 0; i < 2 * MAX_STREAM_FDS; i++) {
    if (c->held[i] >= 0) close(c->held[i]);
    c->held[i] = -1;
  }
}

static void refuse(unsigned long long id, const char *text) {
  struct buffer none = { 0 };
  struct buffer why = { .data = (char *)text, .len = strlen(text) };
  answer(id, 127, &none, &why);
}

/* A pipe whose ends sit at 64 or above (close-on-exec), clear of the fds a plan dup2s into. */
static int high_pipe(int p[2]) {
  int low[2];
  if (pipe2(low, O_CLOEXEC) != 0) return -1;
  for (int i = 0; i < 2; i++) {
    p[i] = fcntl(low[i], F_DUPFD_CLOEXEC, 64);
    close(low[i]);
  }
  if (p[0] < 0 || p[1] < 0) {
    if (p[0] >= 0) close(p[0]);
    if (p[1] >= 0) close(p[1]);
    return -1;
  }
  return 0;
}

/* At most this many bytes in a `d:` plan: written without a reader, so well within a pipe's 64 KiB. */
#define MAX_PLAN_DATA (32 << 10)

/* A pipe (read end at 64 or above, in p[0]) holding the bytes `hex` spells, its write end closed. */
static int pipe_with_data(const char *hex, int p[2]) {
  size_t n = strlen(hex);
  if (n % 2 != 0 || n / 2 > MAX_PLAN_DATA) return -1;
  static char data[MAX_PLAN_DATA];
  for (size_t i = 0; i < n / 2; i++) {
    int v = 0;
    for (int k = 0; k < 2; k++) {
      char c = hex[2 * i + (size_t)k];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    data[i] = (char)v;
  }
  if (high_pipe(p) != 0) return -1;
  size_t done = 0;
  while (done < n / 2) {
    ssize_t w = write(p[1], data + done, n / 2 - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  close(p[1]);
  p[1] = -1;
  if (done != n / 2) {
    close(p[0]);
    return -1;
  }
  return 0;
}

/*
 * `stream`: the plan of each fd, then the argv; the edge opens its pipe ends through /proc.
 * `enter` (`enter` set): the plan of each fd, then a command for a sandbox, started by a fork of
 * this process (spawn-enter.c) rather than by a spawned tool.
 */
static void start_stream(unsigned long long id, char *body, size_t len, int enter) {
  char *fields[4096 + MAX_STREAM_FDS + 1];
  int nf = split_fields(body, len, fields, (int)(sizeof fields / sizeof *fields));
  char *end;
  long nfds = nf > 0 ? strtol(fields[0], &end, 10) : -1;
  if (nf == 0 || *end != 0 || nfds < 0 || nfds > MAX_STREAM_FDS || nf < nfds + 3) return refuse(id, "dsec-spawn: malformed stream request");
  if (nchildren == MAX_CHILDREN) return refuse(id, "dsec-spawn: too many tools running");
  char **plan = fields + 1, *oom = fields[1 + nfds], **argv = fields + 2 + nfds;
  if (strcmp(oom, "-") != 0 && (strtol(oom, &end, 10) < -1000 || *end != 0 || strtol(oom, NULL, 10) > 1000)) return refuse(id, "dsec-spawn: malformed oom_score_adj");
  int held[2 * MAX_STREAM_FDS], edge_fd[MAX_STREAM_FDS], child_end[MAX_STREAM_FDS];
  for (int i = 0; i < 2 * MAX_STREAM_FDS; i++) held[i] = -1;
  for (int i = 0; i < MAX_STREAM_FDS; i++) edge_fd[i] = child_end[i] = -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const char *bad = NULL;
  char text[512] = "";
  for (int fd = 0; fd < nfds && !bad; fd++) {
    int p[2];
    if (strcmp(plan[fd], "null") == 0) {
      posix_spawn_file_actions_addopen(&fa, fd, null_path, fd == 0 ? O_RDONLY : O_WRONLY, 0);
    } else if (strcmp(plan[fd], "in") == 0 || strcmp(plan[fd], "out") == 0) {
      int in = plan[fd][0] == 'i';
      if (high_pipe(p) != 0) {
        bad = "dsec-spawn: pipe failed";
        break;
      }
      /* The tool's end goes to it; the helper keeps the edge's end, and for stdin the tool's end
       * as well, so the edge's open of the write end cannot fail for want of a reader. */
      child_end[fd] = in ? p[0] : p[1];
      edge_fd[fd] = in ? p[1] : p[0];
      held[2 * fd] = edge_fd[fd];
      if (in) held[2 * fd + 1] = p[0];
      posix_spawn_file_actions_adddup2(&fa, child_end[fd], fd);
    } else if (strncmp(plan[fd], "d:", 2) == 0) {
      /* A pipe holding the given bytes (hex in the request), already at its end: written here,
       * before the tool starts, so it reads them without waiting for the edge. */
      if (pipe_with_data(plan[fd] + 2, p) != 0) {
        bad = "dsec-spawn: malformed or too long data for a pipe";
        break;
      }
      child_end[fd] = p[0];
      posix_spawn_file_actions_adddup2(&fa, child_end[fd], fd);
    } else if (strncmp(plan[fd], "w:", 2) == 0 && plan[fd][2] == '/') {
      /* Opened here rather than in the tool, so that a failure says which file. */
      int file = open(plan[fd] + 2, O_WRONLY | O_CLOEXEC);
      int high = file < 0 ? -1 : fcntl(file, F_DUPFD_CLOEXEC, 64);
      if (file >= 0) close(file);
      if (high < 0) {
        snprintf(text, sizeof text, "dsec-spawn: cannot open %s: %s", plan[fd] + 2, strerror(errno));
        bad = text;
        break;
      }
      child_end[fd] = high;
      posix_spawn_file_actions_adddup2(&fa, high, fd);
    } else {
      bad = "dsec-spawn: unknown fd plan";
    }
  }
  pid_t pid = 0;
  int rc = 0;
  if (!bad && enter) {
    /* Where the enter request begins in the body (split_fields cut it into fields in place). */
    size_t at = (size_t)(argv[0] - body);
    /* The sandbox's files, opened and checked at its first command and kept (spawn-sandboxes.c). */
    int noptions = 0;
    while (argv[noptions] && strcmp(argv[noptions], "--") != 0) noptions++;
    const struct enter_sandbox *prepared = argv[noptions] ? spawn_sandbox_for(argv, noptions) : NULL;
    pid = fork();
    if (pid == 0) {
      if (strcmp(oom, "-") != 0 && set_oom_score_adj(oom) != 0) {
        perror("dsec-spawn: cannot set oom_score_adj");
        _exit(255);
      }
      /* split_fields left the body's NULs as they were: the child reads it whole again. */
      spawn_enter_child(body + at, len - at, child_end, (int)nfds, null_path, title, title_room, prepared);
    }
    if (pid < 0) {
      snprintf(text, sizeof text, "dsec-spawn: fork: %s", strerror(errno));
      rc = -1;
    }
  } else if (!bad) {
    posix_spawnattr_t attr;
    init_spawn_attr(&attr);
    /* The tool inherits the score (and, written with CAP_SYS_RESOURCE, its floor) at the spawn. */
    int scored = strcmp(oom, "-") == 0 || set_oom_score_adj(oom) == 0;
    if (!scored) {
      snprintf(text, sizeof text, "dsec-spawn: cannot set oom_score_adj %s: %s", oom, strerror(errno));
      rc = -1;
    } else {
      rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
      if (rc != 0) snprintf(text, sizeof text, "cannot start %s: %s", argv[0], strerror(rc));
      if (strcmp(oom, "-") != 0 && set_oom_score_adj(own_oom_score_adj) != 0) {
        perror("dsec-spawn: cannot restore its own oom_score_adj");
        exit(1); /* rather than start every later tool at the sandbox's score */
      }
    }
    posix_spawnattr_destroy(&attr);
  }
  posix_spawn_file_actions_destroy(&fa);
  /* The tool's ends of the output pipes (and its files) close here, so the edge sees end of file when it ends. */
  for (int fd = 0; fd < nfds; fd++) {
    if (child_end[fd] >= 0 && child_end[fd] != held[2 * fd + 1]) close(child_end[fd]);
  }
  if (bad || rc != 0) {
    for (int i = 0; i < 2 * MAX_STREAM_FDS; i++)
      if (held[i] >= 0) close(held[i]);
    return refuse(id, bad ? bad : text);
  }
  struct child *c = track(id, pid, -1, -1);
  c->stream = 1;
  memcpy(c->held, held, sizeof held);
  char head[64 + 12 * MAX_STREAM_FDS];
  int n = snprintf(head, sizeof head, "%llu started %d", id, (int)pid);
  for (int fd = 0; fd < nfds; fd++) n += snprintf(head + n, sizeof head - (size_t)n, " %d", edge_fd[fd]);
  head[n++] = '\n';
  write_all(head, (size_t)n);
}

/*
 * The template mount namespace. Every `crun run -d` clones the mount namespace it runs in
 * (CLONE_NEWNS copies every mount), makes the copy private, pivot_roots and detaches the old root
 * (every copied mount again). The edge's own namespace holds each sandbox's root, volumes and
 * user namespace file, so a create there costs O(sandboxes on the node). So crun runs instead in
 * a fresh copy of this template: a copy of the edge's namespace made when the helper starts,
 * every mount private (nothing done in a copy propagates back to the edge's), without the mounts
 * below the dirs given as --template (the node's sandboxes and layers: an edge restarted beside
 * thousands of live sandboxes must not copy theirs in). Into each copy the create's own dirs are
 * carried (start_carried), so crun's clone copies the template's few mounts and that sandbox's.
 * The helper itself stays in the edge's namespace: the other tools it starts (dsec-idmap binds a
 * user namespace file there, crun delete) must act on it.
 */
static int template_ns = -1;
static char template_why[256] = "not asked for (dsec-spawn started without --template)";

/* mountinfo escapes a space, tab, newline and backslash in a path as \ooo. */
static void unescape_mountinfo(char *s) {
  char *w = s;
  for (char *r = s; *r;) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 4;
    } else {
      *w++ = *r++;
    }
  }
  *w = 0;
}

/* Detaches every mount strictly below one of `dirs` from this namespace; returns how many. */
static int detach_below(char **dirs, int ndirs) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return 0;
  char *line = NULL;
  size_t cap = 0;
  int detached = 0;
  while (getline(&line, &cap, f) > 0) {
    /* <id> <parent> <dev> <root> <mount point> ... */
    char *field = line, *point = NULL;
    for (int i = 0; i < 5 && field; i++) {
      char *sp = strchr(field, ' ');
      if (i == 4) {
        if (sp) *sp = 0;
        point = field;
      }
      field = sp ? sp + 1 : NULL;
    }
    if (!point) continue;
    unescape_mountinfo(point);
    for (int d = 0; d < ndirs; d++) {
      size_t n = strlen(dirs[d]);
      if (strncmp(point, dirs[d], n) == 0 && point[n] == '/' && umount2(point, MNT_DETACH) == 0) {
        detached++;
        break;
      }
    }
  }
  free(line);
  fclose(f);
  return detached;
}

static void make_template(char **prune, int nprune) {
  int home = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
  int cwd = open(".", O_PATH | O_CLOEXEC);
  if (home < 0 || cwd < 0) {
    snprintf(template_why, sizeof template_why, "cannot open its own mount namespace: %s", strerror(errno));
  } else if (unshare(CLONE_NEWNS) != 0) {
    snprintf(template_why, sizeof template_why, "unshare(CLONE_NEWNS): %s", strerror(errno));
  } else {
    /* Now in the copy; back home below whatever happens. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
      snprintf(template_why, sizeof template_why, "cannot make the template's mounts private: %s", strerror(errno));
    } else {
      /* A detached parent takes its children along; stacked mounts need another pass. */
      for (int pass = 0; pass < 16 && detach_below(prune, nprune) > 0; pass++) {
      }
      template_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
      if (template_ns < 0) snprintf(template_why, sizeof template_why, "cannot open the template: %s", strerror(errno));
    }
    if (setns(home, CLONE_NEWNS) != 0 || fchdir(cwd) != 0) {
      perror("dsec-spawn: cannot return to the edge's mount namespace");
      exit(1);
    }
  }
  if (home >= 0) close(home);
  if (cwd >= 0) close(cwd);
}

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x4
#endif
#define MAX_CARRIED 64

/* In the forked child: says why to the helper (through `report`) and ends. */
static void child_fail(int report, const char *step, const char *what) {
  char text[512];
  int n = snprintf(text, sizeof text, "dsec-spawn: cannot carry: %s %s: %s", step, what, strerror(errno));
  if (write(report, text, (size_t)n) < 0) {
  }
  _exit(127);
}

/*
 * A forked child of this small process (cheap: no large page tables) clones each dir's mount tree
 * here, in the edge's namespace, joins the template, unshares a copy of it (the template itself
 * stays as it is), attaches each clone at its own path and execs the tool. A tool's clone of that
 * copy then copies the template's few mounts and the carried ones. The clones are made private:
 * a mount made below them in the copy does not propagate to the edge's, nor one there to the copy.
 */
static void start_carried(unsigned long long id, char *body, size_t len) {
  char *fields[4096 + MAX_CARRIED + 3];
  int nf = split_fields(body, len, fields, (int)(sizeof fields / sizeof *fields));
  char *end = NULL;
  long ndirs = nf >= 2 ? strtol(fields[1], &end, 10) : -1;
  if (ndirs > MAX_CARRIED) return refuse(id, "dsec-spawn: cannot carry: more than 64 dirs");
  if (nf < 2 || *end != 0 || ndirs < 0 || nf < ndirs + 3 || (strcmp(fields[0], "ignore") != 0 && strcmp(fields[0], "pipe") != 0)) return refuse(id, "dsec-spawn: malformed carry request");
  if (template_ns < 0) {
    char text[384];
    snprintf(text, sizeof text, "dsec-spawn: cannot carry: no template mount namespace: %s", template_why);
    return refuse(id, text);
  }
  if (nchildren == MAX_CHILDREN) return refuse(id, "dsec-spawn: too many tools running");
  int piped = strcmp(fields[0], "pipe") == 0;
  char **dirs = fields + 2, **argv = fields + 2 + ndirs;
  /* Joining the template resets the cwd to its root: a relative dir would name another place there. */
  for (int i = 0; i < ndirs; i++)
    if (dirs[i][0] != '/') return refuse(id, "dsec-spawn: cannot carry: a relative dir");
  int out[2] = { -1, -1 }, err[2] = { -1, -1 }, report[2] = { -1, -1 };
  if ((piped && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) || pipe2(report, O_CLOEXEC) != 0) {
    for (int i = 0; i < 2; i++) {
      if (out[i] >= 0) close(out[i]);
      if (err[i] >= 0) close(err[i]);
      if (report[i] >= 0) close(report[i]);
    }
    return refuse(id, "dsec-spawn: pipe failed");
  }
  pid_t pid = fork();
  if (pid == 0) {
    int clones[MAX_CARRIED];
    for (int i = 0; i < ndirs; i++) {
      clones[i] = (int)syscall(SYS_open_tree, AT_FDCWD, dirs[i], OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE);
      if (clones[i] < 0) child_fail(report[1], "open_tree", dirs[i]);
      struct mount_attr attr = { .propagation = MS_PRIVATE };
      if (syscall(SYS_mount_setattr, clones[i], "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0) child_fail(report[1], "mount_setattr(MS_PRIVATE)", dirs[i]);
    }
    if (setns(template_ns, CLONE_NEWNS) != 0) child_fail(report[1], "setns", "into the template");
    if (unshare(CLONE_NEWNS) != 0) child_fail(report[1], "unshare", "of the template");
    /*
     * A procfs of this copy's own (each procfs mount is a superblock of its own since Linux 5.8).
     * crun writes a sandbox's sysctls (net.ipv4.ping_group_range) through /proc/sys, from the
     * sandbox's network namespace: every namespace's /proc/sys/net is a dentry of its own with
     * the same parent and name, so in one procfs shared by all creates they pile up in one hash
     * chain, one per live sandbox, walked on each lookup (proc_sys_compare, 8.5 % of a create on
     * a node holding 5,000). Best effort: without it crun uses the template's, as before.
     */
    (void)mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    for (int i = 0; i < ndirs; i++) {
      if (syscall(SYS_move_mount, clones[i], "", AT_FDCWD, dirs[i], MOVE_MOUNT_F_EMPTY_PATH) != 0) child_fail(report[1], "move_mount onto", dirs[i]);
    }
    int null = open(null_path, O_RDWR);
    if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(piped ? out[1] : null, STDOUT_FILENO) < 0 || dup2(piped ? err[1] : null, STDERR_FILENO) < 0) child_fail(report[1], "stdio", null_path);
    if (null > STDERR_FILENO) close(null);
    /* As posix_spawn's attributes do in start(): no signal blocked or ignored. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    execvp(argv[0], argv);
    char text[512];
    int n = snprintf(text, sizeof text, "cannot start %s: %s", argv[0], strerror(errno));
    if (write(report[1], text, (size_t)n) < 0) {
    }
    _exit(127);
  }
  int fork_errno = errno;
  close(report[1]);
  if (out[1] >= 0) close(out[1]);
  if (err[1] >= 0) close(err[1]);
  /* Until the exec (report closes, close-on-exec) or a failure (its reason). Short: a few syscalls. */
  char why[512];
  ssize_t got = 0, r;
  while (pid > 0 && (r = read(report[0], why + got, sizeof why - 1 - (size_t)got)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    got += r;
    if ((size_t)got == sizeof why - 1) break;
  }
  close(report[0]);
  if (pid < 0 || got > 0) {
    if (out[0] >= 0) close(out[0]);
    if (err[0] >= 0) close(err[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    else snprintf(why, sizeof why, "dsec-spawn: fork: %s", strerror(fork_errno)), got = (ssize_t)strlen(why);
    why[got] = 0;
    return refuse(id, why);
  }
  track(id, pid, out[0], err[0]);
}

static struct child *find_child(unsigned long long id) {
  for (int i = 0; i < nchildren; i++)
    if (children[i].id == id) return &children[i];
  return NULL;
}

/* `release` and `kill` for a stream tool; an id no longer known (answered, forgotten) is ignored. */
static void control(unsigned long long id, const char *what, char *body, size_t len) {
  struct child *c = find_child(id);
  if (!c || !c->stream) return;
  if (strcmp(what, "release") == 0) {
    close_held(c);
    c->released = 1;
  } else if (strcmp(what, "kill") == 0 && c->pid != 0) {
    char sig[16] = "";
    memcpy(sig, body, len < sizeof sig - 1 ? len : sizeof sig - 1);
    int n = atoi(sig);
    if (n > 0 && n < 65) kill(c->pid, n);
  }
}

/* Reads whole requests from the stdin buffer; returns how many bytes it used. */
static size_t serve(char *buf, size_t len) {
  size_t used = 0;
  for (;;) {
    char *nl = memchr(buf + used, '\n', len - used);
    if (!nl) return used;
    unsigned long long id;
    char stdio[8];
    size_t n;
    *nl = '\0';
    if (sscanf(buf + used, "%llu %7s %zu", &id, stdio, &n) != 3 || n > MAX_REQUEST) {
      fprintf(stderr, "dsec-spawn: malformed request\n");
      exit(1);
    }
    size_t body = (size_t)(nl + 1 - buf);
    if (len - body < n) {
      *nl = '\n';
      return used;
    }
    if (strcmp(stdio, "stream") == 0 || strcmp(stdio, "enter") == 0) start_stream(id, buf + body, n, stdio[0] == 'e');
    else if (strcmp(stdio, "carry") == 0) start_carried(id, buf + body, n);
    else if (strcmp(stdio, "release") == 0 || strcmp(stdio, "kill") == 0) control(id, stdio, buf + body, n);
    else start(id, strcmp(stdio, "pipe") == 0, buf + body, n);
    used = body + n;
  }
}

int main(int argc, char **argv) {
  title = argv[0];
  title_room = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) + 1 - argv[0]);
  /* `--null PATH`: the node a "null" stdio opens, instead of /dev/null (host/private-null.ts:
   * crun chowns its stdio to a user-namespaced container's root; the host's /dev/null must not
   * be what it chowns). */
  if (argc > 2 && strcmp(argv[1], "--null") == 0) {
    null_path = argv[2];
    argv += 2;
    argc -= 2;
  }
  /* `--template DIR...`: make the template namespace, without the mounts below each DIR. */
  if (argc > 1 && strcmp(argv[1], "--template") == 0) make_template(argv + 2, argc - 2);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    perror("dsec-spawn: signalfd");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  read_own_oom_score_adj();
  size_t cap = 1 << 16, len = 0;
  char *in = malloc(cap);
  int stdin_open = 1;
  while (stdin_open) {
    static struct pollfd pfd[2 + 2 * MAX_CHILDREN + SPAWN_MAX_SANDBOXES];
    static struct { int child, stream; } who[2 + 2 * MAX_CHILDREN];
    int np = 0;
    pfd[np] = (struct pollfd){ .fd = STDIN_FILENO, .events = POLLIN };
    who[np++].child = -1;
    pfd[np] = (struct pollfd){ .fd = sfd, .events = POLLIN };
    who[np++].child = -2;
    for (int i = 0; i < nchildren; i++) {
      for (int s = 0; s < 2; s++) {
        if (children[i].fds[s] < 0) continue;
        pfd[np] = (struct pollfd){ .fd = children[i].fds[s], .events = POLLIN };
        who[np].child = i;
        who[np++].stream = s;
      }
    }
    /* The kept sandboxes' inits, last: one that exits is dropped with its files. */
    int nsandboxes = spawn_sandboxes_poll(pfd + np, SPAWN_MAX_SANDBOXES);
    if (poll(pfd, (nfds_t)(np + nsandboxes), -1) < 0) {
      if (errno == EINTR) continue;
      perror("dsec-spawn: poll");
      return 1;
    }
    for (int p = 2; p < np; p++) {
      if (!pfd[p].revents) continue;
      struct child *c = &children[who[p].child];
      char chunk[65536];
      ssize_t r = read(pfd[p].fd, chunk, sizeof chunk);
      if (r > 0) {
        append(&c->out[who[p].stream], chunk, (size_t)r);
      } else if (r == 0 || errno != EINTR) {
        close(c->fds[who[p].stream]);
        c->fds[who[p].stream] = -1;
      }
    }
    spawn_sandboxes_ended(pfd + np, nsandboxes);
    if (pfd[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {
      }
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < nchildren; i++) {
          if (children[i].pid != pid) continue;
          children[i].pid = 0;
          children[i].status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        }
      }
    }
    if (pfd[0].revents) {
      if (len == cap) {
        cap *= 2;
        in = realloc(in, cap);
        if (!in) return 1;
      }
      ssize_t r = read(STDIN_FILENO, in + len, cap - len);
      if (r == 0) stdin_open = 0;
      else if (r > 0) {
        len += (size_t)r;
        size_t used = serve(in, len);
        memmove(in, in + used, len - used);
        len -= used;
      }
    }
    finish_done();
  }
  return 0;
}
