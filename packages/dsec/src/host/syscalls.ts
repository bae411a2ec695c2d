import koffi from 'koffi';

/**
 * The few Linux system calls Node does not expose, through koffi (an FFI made for this):
 * mount(2) for file-backed EROFS and overlay mounts without spawning mount(8) (which would
 * attach a loop device and cost ~15 ms), umount2(2), and openat2(2) with RESOLVE_IN_ROOT so
 * that file paths from the API resolve inside a sandbox's root and never reach the host.
 */
const libc = koffi.load('libc.so.6');
const mountFn = libc.func('int mount(const char *source, const char *target, const char *fstype, unsigned long flags, const char *data)');
const umount2Fn = libc.func('int umount2(const char *target, int flags)');
const OpenHow = koffi.struct('open_how', { flags: 'uint64_t', mode: 'uint64_t', resolve: 'uint64_t' });
const syscallOpenat2 = libc.func('long syscall(long nr, int dirfd, const char *path, open_how *how, size_t size)');
const mkdiratFn = libc.func('int mkdirat(int dirfd, const char *path, uint32_t mode)');
const unlinkatFn = libc.func('int unlinkat(int dirfd, const char *path, int flags)');
const renameatFn = libc.func('int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)');
const Winsize = koffi.struct('winsize', { ws_row: 'uint16_t', ws_col: 'uint16_t', ws_xpixel: 'uint16_t', ws_ypixel: 'uint16_t' });
const ioctlWinsize = libc.func('int ioctl(int fd, unsigned long request, winsize *ws)');
const llistxattrFn = libc.func('long llistxattr(const char *path, _Out_ uint8_t *list, size_t size)');
const lgetxattrFn = libc.func('long lgetxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)');
const lsetxattrFn = libc.func('int lsetxattr(const char *path, const char *name, const uint8_t *value, size_t size, int flags)');
const flistxattrFn = libc.func('long flistxattr(int fd, _Out_ uint8_t *list, size_t size)');
const fsetxattrFn = libc.func('int fsetxattr(int fd, const char *name, const uint8_t *value, size_t size, int flags)');
const fremovexattrFn = libc.func('int fremovexattr(int fd, const char *name)');
const setfsuidFn = libc.func('int setfsuid(uint32_t fsuid)');
const setfsgidFn = libc.func('int setfsgid(uint32_t fsgid)');
const getgroupsFn = libc.func('int getgroups(int size, _Out_ uint32_t *list)');
const syscallSetgroups = libc.func('long syscall(long nr, size_t size, const uint32_t *list)');
const mknodFn = libc.func('int mknod(const char *path, uint32_t mode, uint64_t dev)');
const syncfsFn = libc.func('int syncfs(int fd)');
const strerrorFn = libc.func('const char *strerror(int errnum)');
const syscallLandlockVersion = libc.func('long syscall(long nr, void *attr, size_t size, uint32_t flags)');

export const MS_RDONLY = 1;
export const MS_NOSUID = 2;
export const MS_NODEV = 4;
export const MS_REMOUNT = 32;
export const MS_BIND = 0x1000;
export const MNT_DETACH = 2;
export const SYS_OPENAT2 = 437;
export const RESOLVE_NO_XDEV = 0x01;
export const RESOLVE_NO_MAGICLINKS = 0x02;
export const RESOLVE_NO_SYMLINKS = 0x04;
export const RESOLVE_BENEATH = 0x08;
export const RESOLVE_IN_ROOT = 0x10;
export const O_PATH = 0o10000000;
export const O_DIRECTORY = 0o200000;
export const O_NOFOLLOW = 0o400000;
export const O_CLOEXEC = 0o2000000;
export const AT_REMOVEDIR = 0x200;

/** A failed system call, with errno and its name so callers can branch on it. */
export class SyscallError extends Error {
  override readonly name = 'SyscallError';
  constructor(
    readonly call: string,
    readonly errno: number,
    readonly target: string,
  ) {
    super(`${call}(${target}): ${String(strerrorFn(errno))} (errno ${errno})`);
  }
  get code(): string {
    return ERRNO_NAMES[this.errno] ?? `E${this.errno}`;
  }
}

const ERRNO_NAMES: Record<number, string> = {
  1: 'EPERM',
  2: 'ENOENT',
  7: 'E2BIG',
  11: 'EAGAIN',
  13: 'EACCES',
  15: 'ENOTBLK',
  16: 'EBUSY',
  17: 'EEXIST',
  18: 'EXDEV',
  20: 'ENOTDIR',
  21: 'EISDIR',
  22: 'EINVAL',
  28: 'ENOSPC',
  34: 'ERANGE',
  36: 'ENAMETOOLONG',
  39: 'ENOTEMPTY',
  40: 'ELOOP',
  61: 'ENODATA',
  95: 'ENOTSUP',
};

export function mount(source: string, target: string, fstype: string, flags: number, data: string | null): void {
  if (mountFn(source, target, fstype, flags, data) !== 0) throw new SyscallError('mount', koffi.errno(), `${fstype} ${target}`);
}

export function umount(target: string, flags = 0): void {
  if (umount2Fn(target, flags) !== 0) throw new SyscallError('umount2', koffi.errno(), target);
}

/** openat2(2) relative to dirfd with the given resolve flags; returns a raw fd the caller closes. */
/** How often openat2 is retried when the kernel answers EAGAIN (see below). */
const OPENAT2_EAGAIN_RETRIES = 64;

/**
 * openat2(2). With RESOLVE_IN_ROOT or RESOLVE_BENEATH the kernel answers EAGAIN when a rename or
 * mount elsewhere raced with a `..` in the lookup and it cannot prove the lookup stayed inside
 * (a sandbox swapping directories and symlinks under a files call does this); the call is
 * retried then, as the man page advises, and EAGAIN is thrown only if the race persists.
 */
export function openat2(dirfd: number, path: string, flags: number, mode: number, resolve: number): number {
  const how = { flags: BigInt(flags), mode: BigInt(mode), resolve: BigInt(resolve) };
  for (let attempt = 0; ; attempt++) {
    const fd = Number(syscallOpenat2(SYS_OPENAT2, dirfd, path, how, koffi.sizeof(OpenHow)));
    if (fd >= 0) return fd;
    const errno = koffi.errno();
    if (errno !== 11 || attempt >= OPENAT2_EAGAIN_RETRIES) throw new SyscallError('openat2', errno, path);
  }
}

export function mkdirat(dirfd: number, name: string, mode: number): void {
  if (mkdiratFn(dirfd, name, mode) !== 0) throw new SyscallError('mkdirat', koffi.errno(), name);
}

export function unlinkat(dirfd: number, name: string, flags: number): void {
  if (unlinkatFn(dirfd, name, flags) !== 0) throw new SyscallError('unlinkat', koffi.errno(), name);
}

export function renameat(oldDirfd: number, oldName: string, newDirfd: number, newName: string): void {
  if (renameatFn(oldDirfd, oldName, newDirfd, newName) !== 0) throw new SyscallError('renameat', koffi.errno(), `${oldName} -> ${newName}`);
}

export const TIOCSWINSZ = 0x5414;

/** Sets a terminal's window size (the kernel then sends SIGWINCH to its foreground process group). */
export function setWindowSize(fd: number, cols: number, rows: number): void {
  void Winsize;
  if (ioctlWinsize(fd, TIOCSWINSZ, { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }) !== 0) {
    throw new SyscallError('ioctl(TIOCSWINSZ)', koffi.errno(), String(fd));
  }
}

/** Extended attribute names of a path (not following a final symlink). */
export function listXattrs(path: string): string[] {
  const size = Number(llistxattrFn(path, null, 0));
  if (size < 0) throw new SyscallError('llistxattr', koffi.errno(), path);
  if (size === 0) return [];
  const buf = Buffer.alloc(size);
  const n = Number(llistxattrFn(path, buf, size));
  if (n < 0) throw new SyscallError('llistxattr', koffi.errno(), path);
  return buf.subarray(0, n).toString('latin1').split('\0').filter(Boolean);
}

export function getXattr(path: string, name: string): Buffer {
  const size = Number(lgetxattrFn(path, name, null, 0));
  if (size < 0) throw new SyscallError('lgetxattr', koffi.errno(), `${path} ${name}`);
  const buf = Buffer.alloc(size);
  const n = Number(lgetxattrFn(path, name, buf, size));
  if (n < 0) throw new SyscallError('lgetxattr', koffi.errno(), `${path} ${name}`);
  return buf.subarray(0, n);
}

export function setXattr(path: string, name: string, value: Buffer): void {
  if (lsetxattrFn(path, name, value, value.length, 0) !== 0) throw new SyscallError('lsetxattr', koffi.errno(), `${path} ${name}`);
}

/** Extended attribute names of an open file. */
export function listXattrsOf(fd: number): string[] {
  const size = Number(flistxattrFn(fd, null, 0));
  if (size < 0) throw new SyscallError('flistxattr', koffi.errno(), String(fd));
  if (size === 0) return [];
  const buf = Buffer.alloc(size);
  const n = Number(flistxattrFn(fd, buf, size));
  if (n < 0) throw new SyscallError('flistxattr', koffi.errno(), String(fd));
  return buf.subarray(0, n).toString('latin1').split('\0').filter(Boolean);
}

export function setXattrOf(fd: number, name: string, value: Buffer): void {
  if (fsetxattrFn(fd, name, value, value.length, 0) !== 0) throw new SyscallError('fsetxattr', koffi.errno(), name);
}

export function removeXattrOf(fd: number, name: string): void {
  if (fremovexattrFn(fd, name) !== 0) throw new SyscallError('fremovexattr', koffi.errno(), name);
}

/**
 * setfsuid(2)/setfsgid(2) of the calling thread (they are per-thread: glibc does not broadcast
 * them to the process's other threads). Both return the previous id whether or not the change
 * took, so the new one is read back by a second call with the same value; a refusal is thrown.
 */
export function setFsUid(uid: number): void {
  setfsuidFn(uid);
  if (setfsuidFn(uid) >>> 0 !== uid) throw new SyscallError('setfsuid', 1, String(uid));
}

export function setFsGid(gid: number): void {
  setfsgidFn(gid);
  if (setfsgidFn(gid) >>> 0 !== gid) throw new SyscallError('setfsgid', 1, String(gid));
}

/** The calling thread's supplementary groups. */
export function getGroups(): number[] {
  const n = getgroupsFn(0, null);
  if (n < 0) throw new SyscallError('getgroups', koffi.errno(), '');
  const list = new Uint32Array(Math.max(n, 1));
  const got = getgroupsFn(n, list);
  if (got < 0) throw new SyscallError('getgroups', koffi.errno(), '');
  return [...list.subarray(0, got)];
}

/** setgroups(2)'s number: 116 on x86_64, 159 on arm64 (the generic table). */
export const SYS_SETGROUPS = process.arch === 'arm64' ? 159 : 116;

/**
 * The calling thread's supplementary groups, by the raw system call: glibc's setgroups() sets them
 * on every thread of the process (its setxid broadcast), the kernel's call on the caller only.
 */
export function setThreadGroups(groups: number[]): void {
  if (Number(syscallSetgroups(SYS_SETGROUPS, groups.length, Uint32Array.from(groups))) !== 0) {
    throw new SyscallError('setgroups', koffi.errno(), groups.join(','));
  }
}

/** mknod(2): device nodes (overlay whiteouts are character devices 0:0) and FIFOs. */
export function mknod(path: string, mode: number, dev: number): void {
  if (mknodFn(path, mode, BigInt(dev)) !== 0) throw new SyscallError('mknod', koffi.errno(), path);
}

/** Flushes the filesystem holding `fd` to disk. */
export function syncfs(fd: number): void {
  if (syncfsFn(fd) !== 0) throw new SyscallError('syncfs', koffi.errno(), String(fd));
}

const SYS_LANDLOCK_CREATE_RULESET = 444;
const LANDLOCK_CREATE_RULESET_VERSION = 1;

/** The kernel's Landlock ABI version; 0 when Landlock is not built in or not enabled at boot. */
export function landlockAbi(): number {
  const v = Number(syscallLandlockVersion(SYS_LANDLOCK_CREATE_RULESET, null, 0, LANDLOCK_CREATE_RULESET_VERSION));
  return v > 0 ? v : 0;
}
