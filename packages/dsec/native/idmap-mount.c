/*
 * dsec-idmap: a sandbox's user namespace and the id-mapped mounts its root filesystem needs.
 *
 *   dsec-idmap --map BASE:SIZE [--userns-file FILE]
 *              [--overlay TARGET UPPER WORK --lower DIR [--lower DIR]...]
 *              [--bind SRC DST]...
 *
 * A sandbox that runs in a user namespace is host uids BASE..BASE+SIZE-1 (its root is BASE).
 * The node's shared EROFS layers are owned by host uid 0, so the sandbox would see them as
 * nobody's; each is cloned as a detached mount (open_tree OPEN_TREE_CLONE) and id-mapped with the
 * sandbox's user namespace (mount_setattr MOUNT_ATTR_IDMAP): on that clone, host uid 0 reads as
 * BASE, and so on through the range. The overlay is then built with the new mount API and the
 * clones handed over as file descriptors (fsconfig FSCONFIG_SET_FD "lowerdir+", Linux 6.13+): no
 * id-mapped layer mount is attached anywhere, so none can be left behind; the overlay holds them
 * and they go when it is unmounted. It is mounted nosuid,nodev at TARGET; UPPER is owned by the
 * range (the caller chowns it).
 *
 * --bind SRC DST attaches an id-mapped clone of SRC (recursively) at DST: a volume, whose files
 * are stored with in-sandbox ids (0 = the sandbox's root) and shared by sandboxes of any range.
 *
 * The user namespace is made by a child that first becomes host uid BASE and then unshares, so
 * the namespace's owner is BASE, not root: the kernel charges per-user counts of everything in it
 * (inotify instances and watches, user namespaces, ...) to BASE at the host level, and one
 * sandbox cannot exhaust them for another or for host root. This process (root) writes its
 * uid_map and gid_map ("0 BASE SIZE"; setgroups stays allowed, so apt and su work inside).
 * --userns-file bind-mounts the namespace on FILE, which must exist, so crun can join it
 * ({"type":"user","path":FILE}); the caller unmounts it when the container runs.
 *
 * Errors: a message on stderr naming the step, exit status 1; what was attached is detached.
 * The system call numbers and structures of the mount API are spelt out here, as in
 * landlock-exec.c: the build machine's headers may be older than the kernel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#define SYS_open_tree_ 428
#define SYS_move_mount_ 429
#define SYS_fsopen_ 430
#define SYS_fsconfig_ 431
#define SYS_fsmount_ 432
#define SYS_mount_setattr_ 442

#define OPEN_TREE_CLONE_ 1
#define OPEN_TREE_CLOEXEC_ O_CLOEXEC
#define AT_RECURSIVE_ 0x8000
#define AT_EMPTY_PATH_ 0x1000
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x00000004
#define FSOPEN_CLOEXEC_ 0x00000001
#define FSMOUNT_CLOEXEC_ 0x00000001
#define FSCONFIG_SET_FLAG_ 0
#define FSCONFIG_SET_STRING_ 1
#define FSCONFIG_SET_FD_ 5
#define FSCONFIG_CMD_CREATE_ 6
#define MOUNT_ATTR_RDONLY_ 0x00000001
#define MOUNT_ATTR_NOSUID_ 0x00000002
#define MOUNT_ATTR_NODEV_ 0x00000004
#define MOUNT_ATTR_IDMAP_ 0x00100000

struct mount_attr_ {
  uint64_t attr_set;
  uint64_t attr_clr;
  uint64_t propagation;
  uint64_t userns_fd;
};

#define MAX_LOWERS 500
#define MAX_BINDS 64

static void die(const char *step, const char *what) {
  fprintf(stderr, "dsec-idmap: %s%s%s: %s\n", step, what ? " " : "", what ? what : "", strerror(errno));
  exit(1);
}

static void usage(void) {
  fprintf(stderr,
          "usage: dsec-idmap --map BASE:SIZE [--userns-file FILE] [--overlay TARGET UPPER WORK --lower DIR...] [--bind SRC DST]...\n");
  exit(2);
}

/*
 * A clone of the mount tree at PATH, detached, id-mapped through USERNS_FD, nosuid and nodev (a
 * volume keeps them where crun binds it: inside the user namespace they are locked).
 */
static int idmapped_clone(const char *path, int userns_fd, int recursive) {
  int fd = (int)syscall(SYS_open_tree_, AT_FDCWD, path, OPEN_TREE_CLONE_ | OPEN_TREE_CLOEXEC_ | (recursive ? AT_RECURSIVE_ : 0));
  if (fd < 0) die("open_tree", path);
  struct mount_attr_ attr = {.attr_set = MOUNT_ATTR_IDMAP_ | MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_, .userns_fd = (uint64_t)userns_fd};
  if (syscall(SYS_mount_setattr_, fd, "", AT_EMPTY_PATH_ | (recursive ? AT_RECURSIVE_ : 0), &attr, sizeof attr) != 0)
    die("mount_setattr(MOUNT_ATTR_IDMAP)", path);
  return fd;
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

static void fsconfig_string(int fs, const char *key, const char *value) {
  if (syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, key, value, 0) != 0) die("fsconfig", key);
}

int main(int argc, char **argv) {
  unsigned long base = 0, size = 0;
  const char *userns_file = NULL, *target = NULL, *upper = NULL, *work = NULL;
  const char *lowers[MAX_LOWERS];
  const char *bind_src[MAX_BINDS], *bind_dst[MAX_BINDS];
  int n_lowers = 0, n_binds = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--map") && i + 1 < argc) {
      char *end;
      base = strtoul(argv[++i], &end, 10);
      if (*end != ':') usage();
      size = strtoul(end + 1, &end, 10);
      if (*end || !base || !size) usage();
    } else if (!strcmp(argv[i], "--userns-file") && i + 1 < argc) {
      userns_file = argv[++i];
    } else if (!strcmp(argv[i], "--overlay") && i + 3 < argc) {
      target = argv[++i];
      upper = argv[++i];
      work = argv[++i];
    } else if (!strcmp(argv[i], "--lower") && i + 1 < argc && n_lowers < MAX_LOWERS) {
      lowers[n_lowers++] = argv[++i];
    } else if (!strcmp(argv[i], "--bind") && i + 2 < argc && n_binds < MAX_BINDS) {
      bind_src[n_binds] = argv[++i];
      bind_dst[n_binds++] = argv[++i];
    } else {
      usage();
    }
  }
  if (!size || (target && !n_lowers) || (!target && n_lowers)) usage();

  int userns = make_userns(base, size, userns_file);

  /* Binds first: a failure later leaves only what the caller's teardown of its dir removes. */
  for (int i = 0; i < n_binds; i++) {
    int fd = idmapped_clone(bind_src[i], userns, 1);
    if (syscall(SYS_move_mount_, fd, "", AT_FDCWD, bind_dst[i], MOVE_MOUNT_F_EMPTY_PATH_) != 0) die("move_mount", bind_dst[i]);
    close(fd);
  }

  if (target) {
    int fs = (int)syscall(SYS_fsopen_, "overlay", FSOPEN_CLOEXEC_);
    if (fs < 0) die("fsopen", "overlay");
    /*
     * lowerdir+ takes one layer per call, top first (the order of lowerdir=a:b:c). Each clone's fd
     * stays open until the overlay exists: closing it dissolves the detached mount, and overlayfs
     * clones its layers only at FSCONFIG_CMD_CREATE ("failed to clone lowerpath" otherwise).
     */
    int clones[MAX_LOWERS];
    for (int i = 0; i < n_lowers; i++) {
      clones[i] = idmapped_clone(lowers[i], userns, 0);
      if (syscall(SYS_fsconfig_, fs, FSCONFIG_SET_FD_, "lowerdir+", NULL, clones[i]) != 0) die("fsconfig lowerdir+ (needs Linux 6.13+)", lowers[i]);
    }
    fsconfig_string(fs, "upperdir", upper);
    fsconfig_string(fs, "workdir", work);
    /* As edge/overlay.ts: the upper must be a self-contained diff that pack_diff can read. */
    fsconfig_string(fs, "redirect_dir", "off");
    fsconfig_string(fs, "metacopy", "off");
    if (syscall(SYS_fsconfig_, fs, FSCONFIG_CMD_CREATE_, NULL, NULL, 0) != 0) die("create the overlay at", target);
    for (int i = 0; i < n_lowers; i++) close(clones[i]);
    int mnt = (int)syscall(SYS_fsmount_, fs, FSMOUNT_CLOEXEC_, MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_);
    if (mnt < 0) die("fsmount", target);
    if (syscall(SYS_move_mount_, mnt, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH_) != 0) die("move_mount", target);
  }
  return 0;
}
