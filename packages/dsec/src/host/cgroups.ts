import { existsSync, mkdirSync, readFileSync, readdirSync, rmdirSync, writeFileSync, type Dirent } from 'node:fs';
import { join } from 'node:path';

export const CGROUP_ROOT = '/sys/fs/cgroup';
/** The v1 controllers dsec's sandboxes are limited by; crun creates a cgroup in each. */
export const V1_CONTROLLERS = ['memory', 'pids', 'cpu', 'cpuacct', 'cpuset', 'devices', 'freezer', 'blkio', 'hugetlb'] as const;
/** Every sandbox cgroup lives under this parent, so leaks are easy to find. */
export const CGROUP_PARENT = 'dsec';

/** The CFS period a sandbox's cpu quota is given in (cpu.max, the OCI config's cpu.period). */
export const CPU_PERIOD_US = 100_000;

/**
 * A sandbox's cgroup in every hierarchy, as this process sees them under /sys/fs/cgroup (where
 * crun made them from the sandbox's cgroupsPath): each v1 controller's dir and the cgroup2 one
 * (`unified/` on the hybrid layout, or the root itself on a cgroup2-only host). Links between
 * controller names (cpu → cpu,cpuacct) are skipped so each hierarchy is named once. What
 * dsec-enter moves a command into.
 */
export function sandboxCgroupDirs(id: string): string[] {
  const rel = join(CGROUP_PARENT, id);
  const out: string[] = existsSync(join(CGROUP_ROOT, rel, 'cgroup.procs')) ? [join(CGROUP_ROOT, rel)] : [];
  let entries: Dirent[] = [];
  try {
    entries = readdirSync(CGROUP_ROOT, { withFileTypes: true });
  } catch {
    // no cgroup filesystem here
  }
  for (const e of entries) {
    if (!e.isDirectory()) continue; // links (cpu → cpu,cpuacct) and files
    const dir = join(CGROUP_ROOT, e.name, rel);
    if (existsSync(join(dir, 'cgroup.procs'))) out.push(dir);
  }
  return out;
}

/**
 * The v1 hierarchies crun makes every sandbox's cgroup in, named as crun names their dirs under
 * /sys/fs/cgroup: each line of /proc/self/cgroup with controllers (a named one such as
 * `name=systemd` as `systemd`; `cpuacct,cpu` as `cpu,cpuacct`), kept where that dir exists.
 * Empty on a cgroup2-only host. The edge binds the sandbox's own dir of each at
 * /sys/fs/cgroup/<name> (edge/oci-config.ts), so crun mounts no cgroupfs of its own.
 */
export function v1Hierarchies(): string[] {
  let text = '';
  try {
    text = readFileSync('/proc/self/cgroup', 'utf8');
  } catch {
    return [];
  }
  return v1HierarchyNames(text).filter((name) => existsSync(join(CGROUP_ROOT, name)));
}

/** The v1 hierarchies a /proc/<pid>/cgroup text lists, by their dir names under /sys/fs/cgroup, sorted. */
export function v1HierarchyNames(procCgroup: string): string[] {
  const names = new Set<string>();
  for (const line of procCgroup.split('\n')) {
    const controllers = line.split(':')[1];
    if (!controllers) continue; // "0::/…", the cgroup2 line, or a blank
    // As crun reads it (a named hierarchy by the text after `name=`, wherever it is in the field).
    const named = controllers.indexOf('name=');
    let name = named >= 0 ? controllers.slice(named + 'name='.length) : controllers;
    if (name === 'net_prio,net_cls') name = 'net_cls,net_prio';
    if (name === 'cpuacct,cpu') name = 'cpu,cpuacct';
    names.add(name);
  }
  return [...names].sort();
}

/**
 * Makes dsec's parent in the v1 cpuset hierarchy copy its cpus and mems into each new child
 * (`cgroup.clone_children`). crun writes a new cpuset cgroup's cpus and mems back as it reads
 * them: an empty value makes it copy the parent's, and that write has the kernel check every
 * sibling cpuset and rebuild the scheduler domains, a cost that grows with the sandboxes on the
 * node; a value already there and unchanged is a no-op for the kernel. Only speed depends on it:
 * false (and nothing changed) where there is no v1 cpuset hierarchy or it cannot be set.
 */
export function cloneCpusetIntoSandboxes(parentName: string = CGROUP_PARENT): boolean {
  const root = join(CGROUP_ROOT, 'cpuset');
  const parent = join(root, parentName);
  try {
    if (!existsSync(join(root, 'cgroup.clone_children'))) return false;
    mkdirSync(parent, { recursive: true });
    for (const file of ['cpuset.cpus', 'cpuset.mems']) {
      if (readFileSync(join(parent, file), 'utf8').trim() === '')
        writeFileSync(join(parent, file), readFileSync(join(root, file), 'utf8').trim());
    }
    writeFileSync(join(parent, 'cgroup.clone_children'), '1');
    return true;
  } catch {
    return false;
  }
}

/** Hierarchies (v1 controllers and the v2 mount) that have a cgroup at `rel`. */
export function cgroupDirs(rel: string): string[] {
  const out: string[] = [];
  for (const entry of safeReaddir(CGROUP_ROOT)) {
    const dir = join(CGROUP_ROOT, entry, rel);
    if (existsSync(dir)) out.push(dir);
  }
  return out;
}

/** Removes a cgroup (and empty children) in every hierarchy; cgroups with tasks stay (EBUSY). */
export function removeCgroupTree(rel: string): string[] {
  const left: string[] = [];
  for (const dir of cgroupDirs(rel)) {
    if (!rmdirDeep(dir)) left.push(dir);
  }
  return left;
}

/**
 * Removes a cgroup tree once its processes are gone: a SIGKILLed process leaves its cgroup only
 * when it has finished exiting, so an rmdir right after the kill can meet EBUSY (most often in a
 * command cgroup below the sandbox's, whose process was killed a moment before). Kills what is
 * still there and tries again, up to `tries` times 20 ms apart; returns what is left.
 */
export async function removeCgroupTreeSettled(rel: string, tries = 250): Promise<string[]> {
  let left = removeCgroupTree(rel);
  for (let i = 0; left.length && i < tries; i++) {
    await new Promise((r) => setTimeout(r, 20));
    await killCgroupProcesses(rel);
    left = removeCgroupTree(rel);
  }
  return left;
}

/** Removes a cgroup in every hierarchy only where it has no children and no tasks. */
export function removeEmptyCgroup(rel: string): void {
  for (const dir of cgroupDirs(rel)) {
    try {
      rmdirSync(dir);
    } catch {
      // not empty: still in use
    }
  }
}

function rmdirDeep(dir: string): boolean {
  for (const entry of safeReaddir(dir, true)) rmdirDeep(join(dir, entry));
  try {
    rmdirSync(dir);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ENOENT';
  }
}

function safeReaddir(dir: string, dirsOnly = false): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
      .filter((d) => !dirsOnly || d.isDirectory())
      .map((d) => d.name);
  } catch {
    return [];
  }
}

/**
 * SIGKILLs every process still in a cgroup (any hierarchy). crun delete normally leaves none;
 * this catches a container crun no longer knows (its state lost in a crash), which would
 * otherwise keep running with nothing to account for it.
 */
export async function killCgroupProcesses(rel: string): Promise<number> {
  let killed = 0;
  for (let round = 0; round < 5; round++) {
    const pids = cgroupPids(rel);
    if (pids.length === 0) break;
    if (round > 0) await new Promise((r) => setTimeout(r, 20 * round));
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
        killed++;
      } catch {
        // gone already
      }
    }
  }
  return killed;
}

/** Pids in a cgroup (any hierarchy). */
export function cgroupPids(rel: string): number[] {
  const pids = new Set<number>();
  for (const dir of cgroupDirs(rel)) {
    try {
      for (const line of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n')) if (line) pids.add(Number(line));
    } catch {
      // hierarchy without this cgroup
    }
  }
  return [...pids];
}

/** Pids in each of `dirs` (absolute cgroup dirs) and every cgroup below them: a sandbox's init with its commands' own cgroups. */
export function cgroupTreePids(dirs: readonly string[]): number[] {
  const pids = new Set<number>();
  const walk = (dir: string): void => {
    try {
      for (const line of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n')) if (line) pids.add(Number(line));
    } catch {
      return; // gone meanwhile
    }
    for (const child of safeReaddir(dir, true)) walk(join(dir, child));
  };
  for (const dir of dirs) walk(dir);
  return [...pids];
}

/** Sandbox cgroups under the dsec parent (any hierarchy), e.g. for leak checks. */
export function listSandboxCgroups(): string[] {
  const names = new Set<string>();
  for (const dir of cgroupDirs(CGROUP_PARENT)) for (const child of safeReaddir(dir, true)) names.add(child);
  return [...names];
}

/** The number a one-value kernel file (cgroupfs, sysfs counters) holds; undefined when it is gone or holds no number. */
export function readNumber(file: string): number | undefined {
  try {
    const v = Number(readFileSync(file, 'utf8').trim());
    return Number.isFinite(v) ? v : undefined;
  } catch {
    return undefined;
  }
}

/** How many processes the kernel's OOM killer has ended in the sandbox (read before and after every command). */
export function sandboxOomKills(id: string): number {
  const rel = join(CGROUP_PARENT, id);
  // v1: memory.oom_control has "oom_kill N"; v2: memory.events has "oom_kill N". Read, not first
  // looked up (a stat of a cgroup file on each side of every command): a missing v1 file says v2.
  for (const file of [join(CGROUP_ROOT, 'memory', rel, 'memory.oom_control'), join(CGROUP_ROOT, rel, 'memory.events')]) {
    try {
      return Number(/oom_kill (\d+)/.exec(readFileSync(file, 'utf8'))?.[1] ?? 0);
    } catch {
      // the other layout, or no memory cgroup (sandbox gone)
    }
  }
  return 0;
}

/**
 * CPU time a cgroup2 directory's processes have used, in microseconds (cpu.stat's usage_usec,
 * which cgroup2 keeps for every cgroup, with or without the cpu controller).
 */
export function cgroup2CpuUsec(dir: string): number | undefined {
  try {
    const m = /^usage_usec (\d+)$/m.exec(readFileSync(join(dir, 'cpu.stat'), 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** The sandbox's cgroup2 directory: `unified/` on the hybrid layout (crun makes it there too), else the root's. */
export function sandboxCgroup2Dir(id: string): string | undefined {
  for (const root of [join(CGROUP_ROOT, 'unified'), CGROUP_ROOT]) {
    const dir = join(root, CGROUP_PARENT, id);
    if (existsSync(join(dir, 'cgroup.procs'))) return dir;
  }
  return undefined;
}

/** Live usage of a sandbox's cgroup: OOM kills so far, memory in use, CPU time, process count (its memory peak: memory-peaks.ts). */
export function sandboxUsage(id: string): CgroupUsage {
  const rel = join(CGROUP_PARENT, id);
  const oomKills = sandboxOomKills(id);
  const memoryBytes =
    readNumber(join(CGROUP_ROOT, 'memory', rel, 'memory.usage_in_bytes')) ?? readNumber(join(CGROUP_ROOT, rel, 'memory.current')) ?? 0;
  const pids = readNumber(join(CGROUP_ROOT, 'pids', rel, 'pids.current')) ?? readNumber(join(CGROUP_ROOT, rel, 'pids.current')) ?? 0;
  const usage: CgroupUsage = { oomKills, memoryBytes, pids };
  const dir = sandboxCgroup2Dir(id);
  const cpu = dir === undefined ? undefined : cgroup2CpuUsec(dir);
  if (cpu !== undefined) usage.cpuMs = Math.round(cpu / 10) / 100;
  return usage;
}

export interface CgroupUsage {
  oomKills: number;
  memoryBytes: number;
  pids: number;
  cpuMs?: number;
}
