/*
 * dsec-idmap: a sandbox's user namespace, owned by the sandbox's host uid range.
 *
 *   dsec-idmap --map BASE:SIZE --userns-file FILE
 *
 * A sandbox that runs in a user namespace is host uids BASE..BASE+SIZE-1 (its root is BASE).
 * The edge mounts its root itself (edge/idmapped-root.ts: the shared layers as id-mapped clones
 * through this namespace, handed to overlayfs as file descriptors); this helper exists because
 * the namespace must be made by a single-threaded process that first becomes BASE, which the
 * edge (Node, many threads) cannot be.
 *
 * The user namespace is made by a child that first becomes host uid BASE and then unshares, so
 * the namespace's owner is BASE, not root: the kernel charges per-user counts of everything in it
 * (inotify instances and watches, user namespaces, ...) to BASE at the host level, and one
 * sandbox cannot exhaust them for another or for host root. This process (root) writes its
 * uid_map and gid_map ("0 BASE SIZE"; setgroups stays allowed, so apt and su work inside).
 * --userns-file bind-mounts the namespace on FILE, which must exist, so the edge can open it (for
 * MOUNT_ATTR_IDMAP) and crun can join it ({"type":"user","path":FILE}); the caller unmounts it
 * when the container runs.
 *
 *   dsec-idmap --replace-file SOURCE --pid PID --at PATH
 *
 * Puts the host file SOURCE, bound read-only,nosuid,nodev, over PATH in the mount namespace of
 * process PID (a sandbox's init), PATH read from that process's root. An edge upgrade uses it on
 * the sandboxes it adopts: each one's /dev/.dsec-landlock is a bind of the dsec-landlock that was
 * current when it was made, and a rebuild writes a new file, so a sandbox from before the
 * upgrade keeps the old binary (which may not know the flags the new edge passes). The clone of
 * SOURCE is made in the host's namespace (open_tree), then this process joins the sandbox's
 * mount namespace and moves it there (setns needs a single-threaded process: not the edge). Host
 * root may join the namespace of a user-namespaced sandbox too (its userns is a child of ours).
 * The bind goes on top of the old one, which stays underneath, unreachable.
 *
 * Errors: a message on stderr naming the step, exit status 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

static void die(const char *step, const char *what) {
  fprintf(stderr, "dsec-idmap: %s%s%s: %s\n", step, what ? " " : "", what ? what : "", strerror(errno));
  exit(1);
}

static void usage(void) {
  fprintf(stderr,
          "usage: dsec-idmap --map BASE:SIZE --userns-file FILE\n"
          "       dsec-idmap --replace-file SOURCE --pid PID --at PATH\n");
  exit(2);
}

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) die("open", path);
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die("write", path);
  close(fd);
}

/*
 * A user namespace owned by host uid BASE, mapping 0..SIZE-1 to BASE..; returns its fd. The child
 * that made it is gone on return (the fd, and FILE when given, keep the namespace).
 */
static int make_userns(unsigned long base, unsigned long size, const char *file) {
  int ready[2], done[2];
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(done, O_CLOEXEC) != 0) die("pipe", NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork", NULL);
  if (pid == 0) {
    char c = 0;
    close(ready[0]);
    close(done[1]);
    if (setgroups(0, NULL) != 0 || setresgid(base, base, base) != 0 || setresuid(base, base, base) != 0) die("become the range's base uid", NULL);
    if (unshare(CLONE_NEWUSER) != 0) die("unshare(CLONE_NEWUSER)", NULL);
    if (write(ready[1], &c, 1) != 1) _exit(1);
    if (read(done[0], &c, 1) < 0) _exit(1); /* EOF: the parent has what it needs */
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char c;
  if (read(ready[0], &c, 1) != 1) {
    waitpid(pid, NULL, 0);
    fprintf(stderr, "dsec-idmap: the child could not make the user namespace\n");
    exit(1);
  }
  char path[64], map[96];
  snprintf(map, sizeof map, "0 %lu %lu\n", base, size);
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("open", path);
  if (file && mount(path, file, NULL, MS_BIND, NULL) != 0) die("bind the user namespace on", file);
  close(done[1]);
  waitpid(pid, NULL, 0);
  return fd;
}

/* SOURCE bound read-only,nosuid,nodev over PATH inside the mount namespace of process PID. */
static int replace_file(const char *source, const char *pid, const char *at) {
  char path[64];
  int tree = open_tree(AT_FDCWD, source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree < 0) die("clone a bind of", source);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
  if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) die("make read-only,nosuid,nodev the bind of", source);
  snprintf(path, sizeof path, "/proc/%s/root", pid);
  int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) die("open", path);
  snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) die("open", path);
  if (setns(ns, CLONE_NEWNS) != 0) die("join the mount namespace", path);
  /* setns leaves this process at the namespace's own root; PATH is relative to the sandbox's. */
  if (fchdir(root) != 0 || chroot(".") != 0) die("enter the root of process", pid);
  if (at[0] != '/' || strstr(at, "..")) {
    errno = EINVAL;
    die("check", at);
  }
  if (move_mount(tree, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) != 0) die("bind it over", at);
  return 0;
}

int main(int argc, char **argv) {
  unsigned long base = 0, size = 0;
  const char *userns_file = NULL;
  if (argc == 7 && !strcmp(argv[1], "--replace-file") && !strcmp(argv[3], "--pid") && !strcmp(argv[5], "--at")) {
    if (!argv[4][0] || strspn(argv[4], "0123456789") != strlen(argv[4])) usage();
    return replace_file(argv[2], argv[4], argv[6]);
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--map") && i + 1 < argc) {
      char *end;
      base = strtoul(argv[++i], &end, 10);
      if (*end != ':') usage();
      size = strtoul(end + 1, &end, 10);
      if (*end || !base || !size) usage();
    } else if (!strcmp(argv[i], "--userns-file") && i + 1 < argc) {
      userns_file = argv[++i];
    } else {
      usage();
    }
  }
  if (!size || !userns_file) usage();
  close(make_userns(base, size, userns_file));
  return 0;
}
