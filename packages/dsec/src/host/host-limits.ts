import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import type { Check } from './host-check.js';

/**
 * Host limits a node full of sandboxes runs into, each with what `maxSandboxes` sandboxes need.
 * The per-sandbox figures come from `dsec bench density` (docs/RELIABILITY.md, "A full node"):
 * an idle sandbox is 2 host tasks (catatonit and its child), one overlay and one EROFS mount in
 * the host's mount namespace, a session keyring (crun), and, when it has a network, a veth and
 * its neighbour entries; the sandboxes' processes all run as root in the host's user namespace
 * (without user namespaces), so per-user limits (inotify instances, keys) are shared by all of them.
 */
export interface HostLimit {
  /** A sysctl (dotted, as `sysctl` names it), or `nofile` for this process's open-file limit. */
  name: string;
  /** What it bounds, for the report. */
  why: string;
  need: (maxSandboxes: number) => number;
  /** The value raised to when below `need` (at least `need`); defaults to `need`. */
  raiseTo?: (need: number) => number;
}

export const HOST_LIMITS: readonly HostLimit[] = [
  {
    name: 'kernel.pid_max',
    why: 'host tasks: 2 per idle sandbox plus what runs in them',
    need: (n) => n * 4 + 16384,
    raiseTo: (need) => Math.max(need, 4194304),
  },
  { name: 'kernel.threads-max', why: 'host threads, all sandboxes together', need: (n) => n * 4 + 16384 },
  { name: 'fs.file-max', why: 'open files on the host', need: (n) => n * 64 + 65536 },
  {
    name: 'fs.mount-max',
    why: "mounts in the host's mount namespace: a rootfs overlay and an EROFS layer mount per sandbox",
    need: (n) => n * 4 + 10000,
  },
  {
    name: 'fs.inotify.max_user_instances',
    why: "inotify instances of uid 0, shared by every sandbox's processes (tail -f, file watchers)",
    need: (n) => n * 2,
  },
  { name: 'fs.inotify.max_user_watches', why: 'inotify watches of uid 0, shared by every sandbox', need: (n) => n * 64 },
  { name: 'kernel.pty.max', why: 'pseudo-terminals: one per open terminal session', need: (n) => n * 2 },
  { name: 'kernel.keys.root_maxkeys', why: 'kernel keys of uid 0: crun gives every sandbox a session keyring', need: (n) => n * 2 + 1000 },
  { name: 'kernel.keys.root_maxbytes', why: 'bytes of kernel keys of uid 0', need: (n) => (n * 2 + 1000) * 100 },
  { name: 'kernel.keys.maxkeys', why: 'kernel keys of each other uid (sandboxes in user namespaces)', need: (n) => n * 2 + 200 },
  { name: 'kernel.keys.maxbytes', why: 'bytes of kernel keys of each other uid', need: (n) => (n * 2 + 200) * 100 },
  { name: 'net.netfilter.nf_conntrack_max', why: "tracked connections, all sandboxes' networks together", need: (n) => n * 64 },
  {
    name: 'net.ipv4.neigh.default.gc_thresh3',
    why: "ARP entries on the host side of the sandboxes' veths",
    need: (n) => Math.max(n * 2, 1024),
  },
  { name: 'net.ipv4.neigh.default.gc_thresh2', why: 'ARP entries kept before the collector runs', need: (n) => Math.max(n, 512) },
  {
    name: 'net.ipv6.neigh.default.gc_thresh3',
    why: "IPv6 neighbour entries on the host side of the sandboxes' veths",
    need: (n) => Math.max(n * 2, 1024),
  },
  {
    name: 'net.ipv6.neigh.default.gc_thresh2',
    why: 'IPv6 neighbour entries kept before the collector runs',
    need: (n) => Math.max(n, 512),
  },
  { name: 'user.max_net_namespaces', why: 'network namespaces: one per sandbox', need: (n) => n * 2 },
  { name: 'user.max_mnt_namespaces', why: 'mount namespaces: one per sandbox', need: (n) => n * 2 },
  { name: 'user.max_pid_namespaces', why: 'PID namespaces: one per sandbox', need: (n) => n * 2 },
  // Idle sandboxes hold no fd of dsec's (dsec bench density: 51 fds at 5,000 held); running
  // commands, sessions and connections do: one per sandbox busy at once is the need.
  { name: 'nofile', why: 'open files of the dsec process (connections, exec pipes of running commands)', need: (n) => n + 4096 },
];

function sysctlPath(name: string): string {
  return `/proc/sys/${name.replaceAll('.', '/')}`;
}

/** Soft and hard RLIMIT_NOFILE of a process, from /proc/PID/limits ("unlimited" as Infinity). */
export function readNofile(pid: number | 'self' = 'self'): { soft: number; hard: number } {
  const line = readFileSync(`/proc/${pid}/limits`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max open files'));
  const [soft, hard] = (line?.slice('Max open files'.length).trim().split(/\s+/) ?? []).map((v) =>
    v === 'unlimited' ? Infinity : Number(v),
  );
  return { soft: soft ?? NaN, hard: hard ?? NaN };
}

/** The current value of a limit, or undefined when this kernel has no such knob (e.g. nf_conntrack not loaded). */
export function readLimit(name: string): number | undefined {
  if (name === 'nofile') return readNofile().soft;
  const p = sysctlPath(name);
  if (!existsSync(p)) return undefined;
  return Number(readFileSync(p, 'utf8').trim().split(/\s+/)[0]);
}

function raise(limit: HostLimit, value: number): void {
  if (limit.name === 'nofile') {
    // Node cannot call setrlimit; util-linux's prlimit sets this process's limits from outside.
    const nrOpen = Number(readFileSync('/proc/sys/fs/nr_open', 'utf8'));
    if (value > nrOpen) throw new Error(`fs.nr_open is ${nrOpen}: raise it first`);
    // The soft limit rises up to the hard one freely; a hard limit below the need rises only with
    // CAP_SYS_RESOURCE (absent in some containers: the check then says to raise it outside).
    const { hard } = readNofile();
    const limits = value <= hard ? `${value}:${hard === Infinity ? 'unlimited' : hard}` : `${value}:${value}`;
    try {
      execFileSync('prlimit', [`--pid=${process.pid}`, `--nofile=${limits}`], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (err) {
      const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
      throw new Error(
        `prlimit --nofile=${limits}: ${stderr || (err as Error).message}${value > hard ? ` (the hard limit is ${hard}; raising it needs CAP_SYS_RESOURCE)` : ''}`,
      );
    }
    return;
  }
  writeFileSync(sysctlPath(limit.name), String(value));
}

function fixHint(limit: HostLimit, value: number): string {
  return limit.name === 'nofile'
    ? `ulimit -n ${value} in the shell that starts dsec (or LimitNOFILE=${value})`
    : `sysctl -w ${limit.name}=${value}`;
}

/**
 * One check per host limit against what `maxSandboxes` sandboxes need. With `fix`, a limit below
 * the need is raised (never lowered) and the check says so; one that cannot be raised (a
 * read-only /proc/sys in a container) is a warning with the command to run on the host.
 * None is required: sandboxes run, the node just fills up sooner.
 */
export function hostLimitChecks(opts: { maxSandboxes: number; fix: boolean }): Check[] {
  const checks: Check[] = [];
  const n = opts.maxSandboxes;
  for (const limit of HOST_LIMITS) {
    const name = `host limit ${limit.name} (${n} sandboxes)`;
    const have = readLimit(limit.name);
    if (have === undefined) continue;
    const need = limit.need(n);
    if (have >= need) {
      checks.push({ name, ok: true, detail: `${have} ≥ ${need} needed`, required: false });
      continue;
    }
    const to = limit.raiseTo?.(need) ?? need;
    if (opts.fix) {
      try {
        raise(limit, to);
        checks.push({
          name,
          ok: true,
          detail: `${to}`,
          fixed: `raised ${limit.name} from ${have} to ${to} (${limit.why})`,
          required: false,
        });
        continue;
      } catch (err) {
        checks.push({
          name,
          ok: false,
          detail: `${have} < ${need} needed (${limit.why}); could not raise it: ${(err as Error).message.trim()}; run: ${fixHint(limit, to)}`,
          required: false,
        });
        continue;
      }
    }
    checks.push({ name, ok: false, detail: `${have} < ${need} needed (${limit.why}); run: ${fixHint(limit, to)}`, required: false });
  }
  checks.push(memcgCountCheck(n));
  return checks;
}

/**
 * cgroup v1 memory controller: a memory cgroup id is 16 bits (at most 65,535 live or dying memory
 * cgroups on the host). Each sandbox has one, and a removed one lingers ("dying") while page
 * cache is still charged to it. Nothing to raise: the fix is fewer sandboxes or reclaim.
 */
export function memcgCountCheck(n: number): Check {
  const name = `memory cgroup ids (${n} sandboxes)`;
  const line = readFileSync('/proc/cgroups', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('memory\t') || l.startsWith('memory '));
  const count = Number(line?.trim().split(/\s+/)[2]);
  if (!Number.isFinite(count)) return { name, ok: true, detail: 'no memory controller line in /proc/cgroups', required: false };
  const max = 65535;
  const ok = count + n <= max;
  return {
    name,
    ok,
    detail: ok
      ? `${count} in use + ${n} ≤ ${max}`
      : `${count} memory cgroups exist (live and dying) + ${n} > ${max}, the kernel's limit: lower --max-sandboxes, or reclaim dying ones (sync; echo 3 > /proc/sys/vm/drop_caches)`,
    required: false,
  };
}
