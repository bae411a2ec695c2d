/**
 * A leak census of one edge on this host: what its sandboxes can leave behind (mounts under its
 * data dir, cgroups, network namespaces of sandbox processes, host veths, nftables tables,
 * processes in its cgroups) and what the dsec process itself holds (open fds, child processes,
 * RSS). The reliability suite takes one before and one after its load and compares them.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { readMounts } from '../../src/host/mounts.js';
import { hostVeth } from '../../src/net/sandbox-network.js';

export interface Census {
  mounts: string[];
  /** Binds of the edge's user namespaces made ahead (node/userns-pool): the pool keeps a fixed number. */
  poolMounts: number;
  cgroups: string[];
  /** Network namespaces held by processes in this edge's sandbox cgroups. */
  netns: string[];
  /** Host ends of the load's sandboxes' veths still present. */
  veths: string[];
  nftTables: string[];
  /** Pids in this edge's sandbox cgroups. */
  processes: number[];
  /** Entries of the node's sandboxes directory (one per sandbox the edge still holds). */
  sandboxDirs: string[];
  /** Open fds of the process that runs dsec (`pid`). */
  fds: number;
  /** Direct children of that process. */
  children: number[];
  /** Open fds of those children, summed (the resident helpers: dsec-spawn, dsec-nft). */
  childFds: number;
  /**
   * Processes anywhere on the host, other than `pid`, whose command line names the data dir: a
   * `crun exec` or tool the edge started and lost track of (reparented away, so not a child).
   */
  dataDirProcesses: number[];
  rssBytes: number;
}

/**
 * `sandboxIds`: every sandbox the load made; host veths are named from a hash of the sandbox id,
 * so only theirs are counted (other engineers' network tests make veths on this host too).
 * `pid` is the process that runs dsec: this test process for an in-process server.
 */
/** Whether `pid` runs an edge's resident dsec-spawn (host/spawn-helper.ts). */
function isResidentHelper(pid: number): boolean {
  try {
    return readlinkSync(`/proc/${pid}/exe`).endsWith('/dsec-spawn');
  } catch {
    return false;
  }
}

export function census(dataDir: string, edgeId: string, sandboxIds: Iterable<string>, pid = process.pid): Census {
  const ours = new Set([...sandboxIds].map((id) => hostVeth(id)));
  const all = readMounts()
    .map((m) => m.mountPoint)
    .filter((mp) => mp.startsWith(`${dataDir}/`) && mp !== join(dataDir, 'node', 'sandboxes'));
  // The edge's user namespaces made ahead (edge/userns-pool.ts) come and go with creates: counted, not named.
  const poolDir = `${join(dataDir, 'node', 'userns-pool')}/`;
  const mounts = all.filter((mp) => !mp.startsWith(poolDir));
  const poolMounts = all.length - mounts.length;
  const cgroups: string[] = [];
  const processes = new Set<number>();
  for (const h of readdirSync('/sys/fs/cgroup')) {
    const dir = join('/sys/fs/cgroup', h, 'dsec');
    let names: string[] = [];
    try {
      names = readdirSync(dir).filter((n) => n.startsWith(`sb-${edgeId}-`));
    } catch {
      continue; // no dsec parent in this hierarchy
    }
    for (const n of names) {
      cgroups.push(`${h}/dsec/${n}`);
      try {
        for (const p of readFileSync(join(dir, n, 'cgroup.procs'), 'utf8')
          .split('\n')
          .filter(Boolean))
          processes.add(Number(p));
      } catch {
        // removed meanwhile
      }
    }
  }
  const netns = new Set<string>();
  for (const p of processes) {
    try {
      netns.add(readlinkSync(`/proc/${p}/ns/net`));
    } catch {
      // exited meanwhile
    }
  }
  const links = spawnSync('ip', ['-o', 'link', 'show', 'type', 'veth'], { encoding: 'utf8' }).stdout;
  const veths = links
    .split('\n')
    .map((l) => /^\d+:\s+([^@:]+)/.exec(l)?.[1] ?? '')
    .filter((n) => ours.has(n));
  const nftTables = spawnSync('nft', ['list', 'tables'], { encoding: 'utf8' })
    .stdout.split('\n')
    .filter((l) => l.includes(edgeId));
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  const children: number[] = [];
  const dataDirProcesses: number[] = [];
  let childFds = 0;
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === pid) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) {
        children.push(Number(e));
        childFds += readdirSync(`/proc/${e}/fd`).length;
      }
      // An edge's resident dsec-spawn names the node's dirs it leaves out of its template mount
      // namespace (`--template DIR...`); a restarted edge starts a new one. It is the edge's, not a stray.
      if (readFileSync(`/proc/${e}/cmdline`, 'utf8').includes(`${dataDir}/`) && !isResidentHelper(Number(e)))
        dataDirProcesses.push(Number(e));
    } catch {
      // exited meanwhile
    }
  }
  let sandboxDirs: string[] = [];
  try {
    sandboxDirs = readdirSync(join(dataDir, 'node', 'sandboxes'));
  } catch {
    // no sandboxes directory (an edge that is not local to this process)
  }
  return {
    mounts,
    poolMounts,
    cgroups,
    netns: [...netns],
    veths,
    nftTables,
    processes: [...processes],
    sandboxDirs,
    fds: readdirSync(`/proc/${pid}/fd`).length,
    children,
    childFds,
    dataDirProcesses,
    rssBytes: rssKiB * 1024,
  };
}

/** What `after` holds that `before` did not (fds and children by count: they are reused). */
export function leaked(before: Census, after: Census): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (after.poolMounts > before.poolMounts) out['poolMounts'] = `${before.poolMounts} -> ${after.poolMounts}`;
  for (const k of ['mounts', 'cgroups', 'netns', 'veths', 'nftTables', 'sandboxDirs'] as const) {
    const extra = after[k].filter((x) => !before[k].includes(x));
    if (extra.length) out[k] = extra;
  }
  const procs = after.processes.filter((p) => !before.processes.includes(p));
  if (procs.length) out['processes'] = procs;
  const strays = after.dataDirProcesses.filter((p) => !before.dataDirProcesses.includes(p));
  if (strays.length) out['dataDirProcesses'] = strays;
  if (after.children.length > before.children.length) out['children'] = after.children;
  return out;
}
