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
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_REQUEST (1 << 20)
#define MAX_OUTPUT (1 << 20)
#define MAX_CHILDREN 1024

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
};

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
    if (c->pid == 0 && c->fds[0] < 0 && c->fds[1] < 0) {
      answer(c->id, c->status, &c->out[0], &c->out[1]);
      free(c->out[0].data);
      free(c->out[1].data);
      children[i] = children[--nchildren];
    } else {
      i++;
    }
  }
}

static void start(unsigned long long id, int piped, char *args, size_t len) {
  char *argv[4096];
  int argc = 0;
  for (size_t off = 0; off < len && argc < 4095;) {
    argv[argc++] = args + off;
    off += strlen(args + off) + 1;
  }
  argv[argc] = NULL;
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
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
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
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  /* The tool starts with no signal blocked and every handler at its default, whatever ours are. */
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
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
  struct child *c = &children[nchildren++];
  memset(c, 0, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->fds[0] = out[0];
  c->fds[1] = err[0];
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
    start(id, strcmp(stdio, "pipe") == 0, buf + body, n);
    used = body + n;
  }
}

int main(void) {
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
  size_t cap = 1 << 16, len = 0;
  char *in = malloc(cap);
  int stdin_open = 1;
  while (stdin_open) {
    struct pollfd pfd[2 + 2 * MAX_CHILDREN];
    struct { int child, stream; } who[2 + 2 * MAX_CHILDREN];
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
    if (poll(pfd, (nfds_t)np, -1) < 0) {
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
