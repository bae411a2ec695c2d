import type { ImageConfig } from '@dsec/sdk/schema';
import { CGROUP_PARENT, CGROUP_ROOT, CPU_PERIOD_US } from '../../../host/cgroups.js';
import { mergeEnv } from '../shared/user-env.js';
import { LANDLOCK_BINARY } from '../../../host/native-helpers.js';
import { SANDBOX_OOM_SCORE_ADJ } from '../../../host/node-memory.js';
import type { SandboxLimits } from '../../protocol/edge-api.js';
import type { MountStubs } from './mount-stubs.js';
import { defaultSeccompProfile } from './seccomp.js';

/** Where the init binary (catatonit) appears inside the sandbox: on /dev's tmpfs, so it leaves no trace in the writable layer. */
export const INIT_PATH = '/dev/.dsec-init';
/** catatonit: a static init that reaps zombies; `-P` runs it alone, with no child. */
export const INIT_BINARY = '/usr/bin/catatonit';
/** Where dsec-landlock (native/landlock-exec.c) appears inside the sandbox, beside the init. */
export const LANDLOCK_PATH = '/dev/.dsec-landlock';
/**
 * The tools the platform itself runs inside a sandbox (tar for uploads and downloads, rm for
 * removals): Debian's busybox-static, bind-mounted read-only beside the init. Never the
 * sandbox's own `tar` or `rm`, which an agent can replace to rewrite what the trainer uploads or
 * reads back (the DSec paper's "overwrote /bin/bash" lesson).
 */
export const TOOLBOX_PATH = '/dev/.dsec-tools/busybox';
export const TOOLBOX_BINARY = '/bin/busybox';

/**
 * Pseudo-terminals one sandbox may hold at once. Every devpts instance draws on one host-wide
 * count (kernel.pty.max less kernel.pty.reserve: 3,072 here), so without a cap one sandbox that
 * opens /dev/ptmx in a loop leaves every other sandbox without terminals. Its own devpts
 * instance (newinstance) with `max=` keeps the damage inside it.
 */
export const PTYS_PER_SANDBOX = 256;

/**
 * Docker's default capability set less CAP_NET_RAW: enough for an agent to apt-get install, chown
 * and bind low ports inside its sandbox; no CAP_SYS_ADMIN, SYS_MODULE, SYS_PTRACE, NET_ADMIN,
 * SYS_TIME…. NET_RAW is out because raw and packet sockets skip the sandbox's nftables output
 * chain (the egress policy); ping keeps working through ICMP datagram sockets (ping_group_range).
 */
export const DEFAULT_CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_MKNOD',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
  'CAP_AUDIT_WRITE',
];

/** The numbers of the capabilities dsec names (linux/capability.h; the ABI does not change them). */
const CAPABILITY_NUMBERS: Record<string, number> = {
  CAP_CHOWN: 0,
  CAP_DAC_OVERRIDE: 1,
  CAP_DAC_READ_SEARCH: 2,
  CAP_FOWNER: 3,
  CAP_FSETID: 4,
  CAP_KILL: 5,
  CAP_SETGID: 6,
  CAP_SETUID: 7,
  CAP_SETPCAP: 8,
  CAP_NET_BIND_SERVICE: 10,
  CAP_NET_RAW: 13,
  CAP_SYS_CHROOT: 18,
  CAP_SYS_PTRACE: 19,
  CAP_SYS_ADMIN: 21,
  CAP_MKNOD: 27,
  CAP_AUDIT_WRITE: 29,
  CAP_SETFCAP: 31,
};

/** A set of capabilities as the kernel's bit mask, in hex (what dsec-enter takes as --caps). */
export function capabilityMask(names: readonly string[]): string {
  let mask = 0n;
  for (const name of names) {
    const bit = CAPABILITY_NUMBERS[name];
    if (bit === undefined) throw new Error(`no capability number known for ${name}`);
    mask |= 1n << BigInt(bit);
  }
  return mask.toString(16);
}

/** RLIMIT_NOFILE (soft and hard) of the sandbox's init and of every command started in it. */
export const SANDBOX_NOFILE = 20000;

export const MASKED_PATHS = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
];
const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

export interface ProcessSpec {
  /** Give the process a pseudo-terminal (crun allocates it in the sandbox's own devpts). */
  terminal?: boolean;
  args: string[];
  env: string[];
  cwd: string;
  user: { uid: number; gid: number };
}

/** The `process` block shared by the sandbox's init and every command exec'd into it. */
export function processBlock(p: ProcessSpec): Record<string, unknown> {
  return {
    terminal: p.terminal ?? false,
    user: p.user,
    args: p.args,
    env: p.env,
    cwd: p.cwd,
    capabilities: {
      bounding: DEFAULT_CAPABILITIES,
      effective: DEFAULT_CAPABILITIES,
      permitted: DEFAULT_CAPABILITIES,
    },
    rlimits: [{ type: 'RLIMIT_NOFILE', hard: SANDBOX_NOFILE, soft: SANDBOX_NOFILE }],
    // Set, not inherited from crun's caller: the edge may run at a lowered score (node-memory.ts).
    // crun applies it to the init only; exec'd commands get it as they start (sandbox-process.ts).
    oomScoreAdj: SANDBOX_OOM_SCORE_ADJ,
    noNewPrivileges: true,
  };
}

/**
 * What the sandbox sees at /sys/fs/cgroup. With no v1 hierarchy (a cgroup2-only host) crun mounts
 * cgroup2 itself. With v1 hierarchies, the sandbox's own cgroup dir of each (crun makes them
 * before it sets up the mounts) is bound read-only at /sys/fs/cgroup/<name> on a read-only tmpfs
 * of dsec's, instead of crun's `cgroup` mount, which puts a cgroupfs of its own per hierarchy
 * there: a fresh v1 mount costs a superblock and, in the kernel (cgroup1_get_tree), a walk of
 * every cgroup2 cgroup on the host under the cgroup mutex, once per hierarchy per create, the top
 * cost of a create on a node holding thousands of sandboxes. The cgroup namespace still shows each
 * as its root. crun's mount is not kept under the binds: after skipping the hierarchies the config
 * mounts, it adds symlinks `cpu`, `cpuacct` → `cpu,cpuacct` (and `net_cls`, `net_prio`), which on
 * a host whose cpu and cpuacct are separate hierarchies stand where their binds must go (crun:
 * "openat2 sys/fs/cgroup/cpu: No such file or directory"). Where two controllers share a hierarchy,
 * each of its names is bound too, as the host shows them (there as symlinks).
 */
export function cgroupMounts(hierarchies: readonly string[], cgroupsPath: string, stubRoot?: string): Record<string, unknown>[] {
  if (!hierarchies.length)
    return [{ destination: CGROUP_ROOT, type: 'cgroup', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', 'ro'] }];
  const bind = (name: string, hierarchy: string) => ({
    destination: `${CGROUP_ROOT}/${name}`,
    type: 'bind',
    source: `${CGROUP_ROOT}/${hierarchy}${cgroupsPath}`,
    options: ['bind', 'ro', 'nosuid', 'noexec', 'nodev'],
  });
  // The root: the node's stub dir (edge/mount-stubs.ts, no superblock) when there is one.
  const root = stubRoot
    ? { destination: CGROUP_ROOT, type: 'bind', source: stubRoot, options: ['bind', 'ro', 'nosuid', 'noexec', 'nodev'] }
    : { destination: CGROUP_ROOT, type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'noexec', 'nodev', 'ro', 'mode=755', 'size=64k'] };
  return [root, ...hierarchies.map((h) => bind(h, h)), ...cgroupAliases(hierarchies).map(([name, h]) => bind(name, h))];
}

/** Each other name of a shared hierarchy (`cpu` and `cpuacct` of `cpu,cpuacct`) that is not a hierarchy's own, with that hierarchy. */
function cgroupAliases(hierarchies: readonly string[]): [name: string, hierarchy: string][] {
  return hierarchies.flatMap((h) =>
    h.includes(',')
      ? h
          .split(',')
          .filter((n) => !hierarchies.includes(n))
          .map((n): [string, string] => [n, h])
      : [],
  );
}

/** Every name /sys/fs/cgroup shows in a sandbox: the hierarchies and their aliases (the dirs the cgroup stub root needs). */
export function cgroupNames(hierarchies: readonly string[]): string[] {
  return [...hierarchies, ...cgroupAliases(hierarchies).map(([name]) => name)];
}

/** crun's annotation for a precompiled seccomp program (crun.1: "use the specified data as the raw data to seccomp(2)"). */
export const SECCOMP_BPF_ANNOTATION = 'run.oci.seccomp_bpf_data';

/** The OCI runtime config for one sandbox (crun reads it from the bundle's config.json). */
export function buildOciConfig(opts: {
  id: string;
  config: ImageConfig;
  env: Record<string, string>;
  limits: SandboxLimits;
  /** Host directories bind-mounted at `path` (named volumes): never setuid, never devices. */
  binds?: { source: string; path: string; readOnly: boolean }[];
  /**
   * defaultSeccompProfile() compiled to BPF, base64 (edge/seccomp-bpf.ts): handed to crun as its
   * `run.oci.seccomp_bpf_data` annotation instead of the profile, so crun loads it as it is
   * rather than compiling the same profile again on every create. Without it, the profile.
   */
  seccompBpf?: string | undefined;
  /**
   * Run in this user namespace (made by dsec-idmap, bound on `path`): ids 0..size-1 inside are
   * host ids base.. outside. crun joins it rather than making one, so its owner is the range's
   * base uid and not root (see native/idmap-mount.c); the mappings are repeated for crun's sake.
   */
  userns?: { path: string; base: number; size: number };
  /** The parent of the sandbox's cgroup in every hierarchy (`dsec`; a benchmark's raw crun uses its own). */
  cgroupParent?: string;
  /** The v1 hierarchies (host/cgroups.ts v1Hierarchies), each bound from the sandbox's own cgroup dir: see cgroupMounts. */
  cgroupHierarchies?: readonly string[];
  /**
   * The shared read-only dirs bound instead of a tmpfs each (edge/mount-stubs.ts), with the masked
   * paths that are directories now (existingDirs), bound to the empty one; without them, crun's tmpfs.
   */
  stubs?: (MountStubs & { maskedDirs: readonly string[] }) | undefined;
}): Record<string, unknown> {
  const { id, limits, userns, stubs } = opts;
  const cgroupsPath = `/${opts.cgroupParent ?? CGROUP_PARENT}/${id}`;
  const mapping = userns ? [{ containerID: 0, hostID: userns.base, size: userns.size }] : undefined;
  const memory = limits.memoryMiB * 1024 * 1024;
  return {
    ociVersion: '1.0.2',
    ...(opts.seccompBpf ? { annotations: { [SECCOMP_BPF_ANNOTATION]: opts.seccompBpf } } : {}),
    process: processBlock({
      args: [INIT_PATH, '-P'],
      env: mergeEnv(opts.config.env, opts.env),
      cwd: '/',
      user: { uid: 0, gid: 0 },
    }),
    root: { path: 'rootfs', readonly: false },
    hostname: id.slice(-12),
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc' },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      {
        destination: '/dev/pts',
        type: 'devpts',
        source: 'devpts',
        options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', `max=${PTYS_PER_SANDBOX}`],
      },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      ...cgroupMounts(opts.cgroupHierarchies ?? [], cgroupsPath, opts.stubs?.cgroupRoot),
      // Masked directories: the empty stub, read-only, after /proc and /sys are mounted.
      ...(stubs?.maskedDirs ?? []).map((d) => ({
        destination: d,
        type: 'bind',
        source: stubs!.emptyDir,
        options: ['bind', 'ro', 'nosuid', 'noexec', 'nodev'],
      })),
      { destination: INIT_PATH, type: 'bind', source: INIT_BINARY, options: ['bind', 'ro', 'nosuid', 'nodev'] },
      { destination: LANDLOCK_PATH, type: 'bind', source: LANDLOCK_BINARY, options: ['bind', 'ro', 'nosuid', 'nodev'] },
      { destination: TOOLBOX_PATH, type: 'bind', source: TOOLBOX_BINARY, options: ['bind', 'ro', 'nosuid', 'nodev'] },
      ...(opts.binds ?? []).map((b) => ({
        destination: b.path,
        type: 'bind',
        source: b.source,
        options: ['rbind', b.readOnly ? 'ro' : 'rw', 'nosuid', 'nodev', 'rprivate'],
      })),
    ],
    linux: {
      namespaces: [
        ...(userns ? [{ type: 'user', path: userns.path }] : []),
        { type: 'pid' },
        { type: 'network' },
        { type: 'ipc' },
        { type: 'uts' },
        { type: 'mount' },
        { type: 'cgroup' },
      ],
      ...(mapping ? { uidMappings: mapping, gidMappings: mapping } : {}),
      cgroupsPath,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: memory, swap: memory },
        pids: { limit: limits.pids },
        cpu: { shares: Math.max(2, Math.round(limits.cpu * 1024)), quota: Math.round(limits.cpu * CPU_PERIOD_US), period: CPU_PERIOD_US },
      },
      maskedPaths: stubs ? MASKED_PATHS.filter((p) => !stubs.maskedDirs.includes(p)) : MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
      rootfsPropagation: 'private',
      // Unprivileged ICMP echo sockets, so ping works without CAP_NET_RAW (a per-netns sysctl). In
      // a user namespace both ends must be gids it maps.
      sysctl: { 'net.ipv4.ping_group_range': `0 ${userns ? userns.size - 1 : 2147483647}` },
      ...(opts.seccompBpf ? {} : { seccomp: defaultSeccompProfile() }),
    },
  };
}
