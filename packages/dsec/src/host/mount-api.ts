import { closeSync } from 'node:fs';
import { dirname, basename } from 'node:path';
import koffi from 'koffi';
import { O_CLOEXEC, O_DIRECTORY, O_PATH, SyscallError, openat2 } from './syscalls.js';

/**
 * The new mount API (open_tree, mount_setattr, fsopen/fsconfig/fsmount, move_mount), through koffi
 * as host/syscalls.ts does for mount(2): what a sandbox's root needs and mount(2) cannot give.
 * - Layers handed to overlayfs as file descriptors of detached clones (`lowerdir+`, `upperdir`,
 *   `workdir` with FSCONFIG_SET_FD, Linux 6.13+): the overlay's options then show each layer's
 *   path inside its own detached mount (`lowerdir+=/`, `upperdir=/upper`), never a host path, a
 *   data dir or a layer digest, in the sandbox's /proc/self/mountinfo.
 * - Id-mapped clones (MOUNT_ATTR_IDMAP) for sandboxes in a user namespace: host uid 0 in a shared
 *   layer reads as the sandbox's root. None is attached anywhere: the overlay holds its layers.
 * The system call numbers are x86_64's and spelt out (Node's headers know none of them).
 */
const libc = koffi.load('libc.so.6');
const MountAttr = koffi.struct('mount_attr', {
  attr_set: 'uint64_t',
  attr_clr: 'uint64_t',
  propagation: 'uint64_t',
  userns_fd: 'uint64_t',
});
const sysOpenTree = libc.func('long syscall(long nr, int dfd, const char *path, unsigned int flags)');
const sysMountSetattr = libc.func('long syscall(long nr, int dfd, const char *path, unsigned int flags, mount_attr *attr, size_t size)');
const sysFsopen = libc.func('long syscall(long nr, const char *fsname, unsigned int flags)');
const sysFsconfig = libc.func('long syscall(long nr, int fd, unsigned int cmd, const char *key, const char *value, int aux)');
const sysFsmount = libc.func('long syscall(long nr, int fd, unsigned int flags, unsigned int attrs)');
const sysMoveMount = libc.func(
  'long syscall(long nr, int from_dfd, const char *from_path, int to_dfd, const char *to_path, unsigned int flags)',
);

const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_FSOPEN = 430;
const SYS_FSCONFIG = 431;
const SYS_FSMOUNT = 432;
const SYS_MOUNT_SETATTR = 442;

const OPEN_TREE_CLONE = 1;
const AT_FDCWD = -100;
const AT_EMPTY_PATH = 0x1000;
const AT_RECURSIVE = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const FSOPEN_CLOEXEC = 1;
const FSMOUNT_CLOEXEC = 1;
const FSCONFIG_SET_STRING = 1;
const FSCONFIG_SET_FD = 5;
const FSCONFIG_CMD_CREATE = 6;
export const MOUNT_ATTR_NOSUID = 0x2;
export const MOUNT_ATTR_NODEV = 0x4;
const MOUNT_ATTR_IDMAP = 0x100000;

/** overlayfs' limit on lower layers (OVL_MAX_STACK). */
export const MAX_OVERLAY_LAYERS = 500;

function check(call: string, target: string, r: bigint | number): number {
  const n = Number(r);
  if (n < 0) throw new SyscallError(call, koffi.errno(), target);
  return n;
}

/** A detached clone of the mount tree at `path` (recursive: with its submounts); the caller closes the fd. */
export function cloneTree(path: string, recursive = false): number {
  return check('open_tree', path, sysOpenTree(SYS_OPEN_TREE, AT_FDCWD, path, OPEN_TREE_CLONE | O_CLOEXEC | (recursive ? AT_RECURSIVE : 0)));
}

/** Id-maps a detached clone through the user namespace `usernsFd`, nosuid and nodev. */
export function idmapClone(fd: number, usernsFd: number, recursive: boolean, what: string): void {
  const attr = {
    attr_set: BigInt(MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV),
    attr_clr: 0n,
    propagation: 0n,
    userns_fd: BigInt(usernsFd),
  };
  check(
    'mount_setattr(MOUNT_ATTR_IDMAP)',
    what,
    sysMountSetattr(SYS_MOUNT_SETATTR, fd, '', AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), attr, koffi.sizeof(MountAttr)),
  );
}

/** Attaches a detached mount at `target`. */
export function attachMount(fd: number, target: string): void {
  check('move_mount', target, sysMoveMount(SYS_MOVE_MOUNT, fd, '', AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH));
}

/**
 * Mounts an overlay at `target`, nosuid and nodev, whose layers are all given as file descriptors:
 * each lower a detached clone of its mount (id-mapped through `usernsFd` when given), and the
 * upper and work dirs opened inside one detached clone of the mount that holds them (they must
 * share it: overlayfs refuses an upper and work dir on two mounts). The overlay clones what it
 * needs at create; the fds are closed before this returns, so no clone outlives it.
 */
export function mountOverlayByFd(o: {
  lowersTopFirst: string[];
  upper: string;
  work: string;
  target: string;
  usernsFd?: number;
  options: Record<string, string>;
}): void {
  if (dirname(o.upper) !== dirname(o.work)) throw new Error(`the upper and work dirs must share a parent: ${o.upper}, ${o.work}`);
  const fds: number[] = [];
  try {
    const fs = check('fsopen', 'overlay', sysFsopen(SYS_FSOPEN, 'overlay', FSOPEN_CLOEXEC));
    fds.push(fs);
    for (const lower of o.lowersTopFirst) {
      const clone = cloneTree(lower);
      fds.push(clone);
      if (o.usernsFd !== undefined) idmapClone(clone, o.usernsFd, false, lower);
      // lowerdir+ appends one layer per call, top first (the order of lowerdir=a:b:c).
      check('fsconfig(lowerdir+)', lower, sysFsconfig(SYS_FSCONFIG, fs, FSCONFIG_SET_FD, 'lowerdir+', null, clone));
    }
    // The upper's mount, cloned: the overlay's options show the dirs' paths inside this detached
    // clone (`/upper`, `/work`), not where the node keeps them.
    const holder = cloneTree(dirname(o.upper));
    fds.push(holder);
    for (const [key, path] of [
      ['upperdir', o.upper],
      ['workdir', o.work],
    ] as const) {
      const fd = openat2(holder, basename(path), O_PATH | O_DIRECTORY | O_CLOEXEC, 0, 0);
      fds.push(fd);
      check(`fsconfig(${key})`, path, sysFsconfig(SYS_FSCONFIG, fs, FSCONFIG_SET_FD, key, null, fd));
    }
    for (const [k, v] of Object.entries(o.options))
      check(`fsconfig(${k})`, o.target, sysFsconfig(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, k, v, 0));
    check('fsconfig(create) of the overlay at', o.target, sysFsconfig(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, null, null, 0));
    const mnt = check('fsmount', o.target, sysFsmount(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
    fds.push(mnt);
    attachMount(mnt, o.target);
  } finally {
    for (const fd of fds) closeSync(fd);
  }
}
