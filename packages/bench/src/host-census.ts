import { readdirSync, readFileSync } from 'node:fs';
import type { CgroupScope } from './cgroup-memory.js';
import type { PeerName } from './peers/peer.js';
import { readMeminfo } from './meminfo.js';

/** A process on the host: its command name and its memory cgroup path (v1 `memory` line, or the v2 `0::` line). */
export interface HostProcess {
  pid: number;
  ppid: number;
  comm: string;
  cgroup: string;
}

/** Every process on the host now. Processes that exit while being read are skipped. */
export function listProcesses(): HostProcess[] {
  const out: HostProcess[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split after the last ')'.
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const comm = stat.slice(stat.indexOf('(') + 1, close);
      const ppid = Number(stat.slice(close + 2).split(' ')[1]);
      out.push({ pid: Number(name), ppid, comm, cgroup: memoryCgroup(readFileSync(`/proc/${name}/cgroup`, 'utf8')) });
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

/** The memory controller's path from /proc/PID/cgroup text (v1 `N:memory:/path`, else v2 `0::/path`). */
export function memoryCgroup(text: string): string {
  const lines = text.split('\n');
  const v1 = lines.find((l) => /^\d+:([^:]*,)?memory(,[^:]*)?:/.test(l));
  const v2 = lines.find((l) => l.startsWith('0::'));
  return (v1 ?? v2 ?? '').replace(/^[^:]*:[^:]*:/, '');
}

/** Whether a cgroup path lies in a peer's sandboxes' cgroups. */
export function inScope(cgroup: string, scope: CgroupScope): boolean {
  const base = `/${scope.parent.replace(/^\/+/, '')}/`;
  if (!cgroup.startsWith(base)) return false;
  return !scope.prefix || cgroup.slice(base.length).startsWith(scope.prefix);
}

/**
 * The per-sandbox helpers a runtime leaves resident (conmon, containerd-shim): ancestors of the
 * sandboxes' processes that live outside that sandbox's own cgroup and appeared since `before`
 * (so the daemons set up first, this process and PID 1 are not counted, nor other tenants' jobs).
 * Counted by command name.
 */
export function residentHelpers(before: ReadonlySet<number>, scope: CgroupScope, now = listProcesses()): Record<string, number> {
  const byPid = new Map(now.map((p) => [p.pid, p]));
  const helpers = new Set<HostProcess>();
  for (const p of now) {
    if (!inScope(p.cgroup, scope)) continue;
    for (let q = byPid.get(p.ppid); q && q.pid > 1 && !before.has(q.pid) && q.pid !== process.pid; q = byPid.get(q.ppid))
      if (q.cgroup !== p.cgroup && !q.cgroup.startsWith(`${p.cgroup}/`)) helpers.add(q);
  }
  const out: Record<string, number> = {};
  for (const h of helpers) out[h.comm] = (out[h.comm] ?? 0) + 1;
  return out;
}

/**
 * Rough worst cases per idle sandbox, for refusing a run the host cannot hold: host tasks
 * (pid_max counts threads; a containerd shim has about a dozen) and MiB.
 */
const PER_SANDBOX: Record<PeerName, { tasks: number; mib: number }> = {
  dsec: { tasks: 3, mib: 3 },
  crun: { tasks: 3, mib: 3 },
  podman: { tasks: 6, mib: 6 },
  docker: { tasks: 16, mib: 12 },
  floor: { tasks: 3, mib: 3 },
};
const RESERVE_TASKS = 2000;
const RESERVE_MIB = 1024;

export interface HostLimits {
  pidMax: number;
  threadsMax: number;
  /** Tasks (threads) running on the host now. */
  tasks: number;
  memAvailableMiB: number;
}

export function readHostLimits(): HostLimits {
  const num = (file: string): number => Number(readFileSync(file, 'utf8').trim());
  return {
    pidMax: num('/proc/sys/kernel/pid_max'),
    threadsMax: num('/proc/sys/kernel/threads-max'),
    tasks: Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3]?.split('/')[1] ?? NaN),
    memAvailableMiB: Math.floor(readMeminfo().memAvailableKiB / 1024),
  };
}

/**
 * Why `n` live sandboxes of the largest asked-for peer (peers run one after the other) cannot
 * fit on this host, or undefined when they fit with room to spare.
 */
export function headroomProblem(n: number, peers: PeerName[], host: HostLimits): string | undefined {
  const worst = (['dsec', ...peers] as PeerName[]).reduce(
    (a, p) => ({ tasks: Math.max(a.tasks, PER_SANDBOX[p].tasks), mib: Math.max(a.mib, PER_SANDBOX[p].mib) }),
    { tasks: 0, mib: 0 },
  );
  const problems: string[] = [];
  const taskLimit = Math.min(host.pidMax, host.threadsMax);
  const tasksNeeded = host.tasks + n * worst.tasks + RESERVE_TASKS;
  if (tasksNeeded > taskLimit)
    problems.push(
      `${n} sandboxes need about ${n * worst.tasks} more host tasks (${worst.tasks} each) on top of the ${host.tasks} running and ${RESERVE_TASKS} spare, ` +
        `over kernel.pid_max/threads-max ${taskLimit}`,
    );
  const mibNeeded = n * worst.mib + RESERVE_MIB;
  if (mibNeeded > host.memAvailableMiB)
    problems.push(
      `${n} sandboxes need up to ${mibNeeded} MiB (${worst.mib} MiB each + ${RESERVE_MIB} MiB spare), only ${host.memAvailableMiB} MiB available`,
    );
  return problems.length ? `${problems.join('; ')}; lower -n` : undefined;
}

/** The preflight of scenarios that keep `n` sandboxes alive at once. */
export function requireHeadroom(scenario: string, n: number, peers: PeerName[]): void {
  const problem = headroomProblem(n, peers, readHostLimits());
  if (problem) throw new Error(`dsec bench ${scenario}: refusing to start: ${problem}`);
}
