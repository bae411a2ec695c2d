/**
 * The default seccomp profile: allow everything except what a sandbox never needs and what
 * container escapes and host disruption are made of. A deny list (not Docker's allow list) keeps
 * every ordinary program working, which an agent installing arbitrary packages needs; the
 * dangerous surface is named here one call at a time. Denied calls fail with EPERM (clone3 with
 * ENOSYS, so libc falls back to clone, whose flags can be filtered).
 */
export const DENIED_SYSCALLS: Record<string, string> = {
  // kernel code and the running kernel
  init_module: 'load a kernel module',
  finit_module: 'load a kernel module',
  delete_module: 'unload a kernel module',
  create_module: 'obsolete module call',
  query_module: 'obsolete module call',
  get_kernel_syms: 'obsolete module call',
  kexec_load: 'boot another kernel',
  kexec_file_load: 'boot another kernel',
  reboot: 'reboot or halt the host',
  // kernel attack surface
  bpf: 'load BPF programs',
  perf_event_open: 'kernel profiling (side channels, frequent CVEs)',
  userfaultfd: 'page-fault handling, a common exploit primitive',
  lookup_dcookie: 'kernel profiling',
  iopl: 'raw I/O port access',
  ioperm: 'raw I/O port access',
  syslog: 'read or clear the kernel log',
  vhangup: 'hang up the terminal',
  uselib: 'obsolete loader call',
  nfsservctl: 'obsolete NFS server control',
  _sysctl: 'obsolete sysctl',
  // other processes: reading or changing what another process holds. A process that lingers from
  // one command could otherwise take a later command's pipes (pidfd_getfd) or memory and forge
  // its output or exit status. The exec engine needs none of them (it works from the host).
  ptrace: 'trace or change another process',
  process_vm_readv: "read another process's memory",
  process_vm_writev: "write another process's memory",
  pidfd_getfd: "take a copy of another process's file descriptor",
  kcmp: "compare other processes' kernel objects (an address oracle)",
  // io_uring: a second system call interface that seccomp filters cannot see into, and a rich
  // source of kernel escapes; ordinary programs fall back to plain read/write without it.
  io_uring_setup: 'io_uring (kernel attack surface)',
  io_uring_enter: 'io_uring (kernel attack surface)',
  io_uring_register: 'io_uring (kernel attack surface)',
  // filesystems and namespaces
  mount: 'mount a filesystem',
  umount: 'unmount',
  umount2: 'unmount',
  pivot_root: 'change the root mount',
  move_mount: 'new mount API',
  open_tree: 'new mount API',
  fsopen: 'new mount API',
  fsconfig: 'new mount API',
  fsmount: 'new mount API',
  fspick: 'new mount API',
  mount_setattr: 'change mount attributes',
  unshare: 'create namespaces',
  setns: 'join other namespaces',
  open_by_handle_at: 'open files by handle, bypassing the mount namespace (the "shocker" escape)',
  name_to_handle_at: 'file handles, see open_by_handle_at',
  quotactl: 'filesystem quotas',
  quotactl_fd: 'filesystem quotas',
  swapon: 'host swap',
  swapoff: 'host swap',
  acct: 'process accounting',
  // keys and time
  keyctl: 'kernel keyrings (not namespaced)',
  add_key: 'kernel keyrings',
  request_key: 'kernel keyrings',
  settimeofday: 'set the host clock',
  stime: 'set the host clock',
  clock_settime: 'set the host clock',
  clock_adjtime: 'adjust the host clock',
  adjtimex: 'adjust the host clock',
};

/** clone() flags that create namespaces; clone() with any of them is refused. */
export const CLONE_NAMESPACE_FLAGS: Record<string, number> = {
  CLONE_NEWTIME: 0x80,
  CLONE_NEWNS: 0x20000,
  CLONE_NEWCGROUP: 0x2000000,
  CLONE_NEWUTS: 0x4000000,
  CLONE_NEWIPC: 0x8000000,
  CLONE_NEWUSER: 0x10000000,
  CLONE_NEWPID: 0x20000000,
  CLONE_NEWNET: 0x40000000,
};

const EPERM = 1;
const ENOSYS = 38;

/** An OCI `linux.seccomp` block, as far as dsec's profiles use it. */
export interface SeccompProfile {
  defaultAction: string;
  defaultErrnoRet?: number;
  architectures?: string[];
  syscalls?: {
    names: string[];
    action: string;
    errnoRet?: number;
    args?: { index: number; value: number; valueTwo?: number; op: string }[];
  }[];
}

/** The OCI `linux.seccomp` block. */
export function defaultSeccompProfile(): SeccompProfile {
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'],
    syscalls: [
      { names: Object.keys(DENIED_SYSCALLS), action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      ...Object.values(CLONE_NAMESPACE_FLAGS).map((flag) => ({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }],
      })),
    ],
  };
}
