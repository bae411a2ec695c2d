import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tryUnmount } from 'dsec/container';
import { isProcessAlive, CGROUP_PARENT, CGROUP_ROOT, removeCgroupTree, findLeaks, mountsUnder, runTool, dataDirImagePath } from 'dsec/host';
import { NAME_PREFIX, type RunNames } from './run-names.js';

/** Every cgroup a run may make: raw crun's, podman's and docker's parents, and dsec's `sb-bench-…`. */
function benchCgroups(names: RunNames): string[] {
  const out = new Set<string>();
  const ls = (dir: string): string[] => {
    try {
      return readdirSync(dir, { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name);
    } catch {
      return [];
    }
  };
  for (const h of ls(CGROUP_ROOT)) {
    for (const name of ls(join(CGROUP_ROOT, h))) if (name.startsWith(`${NAME_PREFIX}${names.id}-`)) out.add(name);
    // `sb-bench<id>-…` of the in-process edge, `sb-bench<id>r1-…` / `sb-bench<id>m1-…` of the cluster and migrate scenarios' real edges.
    for (const name of ls(join(CGROUP_ROOT, h, CGROUP_PARENT)))
      if (name.startsWith(`sb-${names.edgeId}`)) out.add(`${CGROUP_PARENT}/${name}`);
  }
  return [...out];
}

/** crun state roots a run uses: dsec's edge, raw crun, and the real edges of the cluster and migrate scenarios. */
function crunRoots(dir: string): string[] {
  const edges = ['cluster-real', 'migrate'].flatMap((sub) => {
    const real = join(dir, sub);
    return existsSync(real)
      ? readdirSync(real)
          .filter((d) => d.startsWith('edge'))
          .map((d) => join(real, d, 'node', 'crun'))
      : [];
  });
  return [join(dir, 'dsec', 'node', 'crun'), join(dir, 'crun', 'crun-state'), ...edges].filter(existsSync);
}

function dockerdPid(dir: string): number | undefined {
  const file = join(dir, 'docker', 'dockerd.pid');
  try {
    const pid = Number(readFileSync(file, 'utf8'));
    return isProcessAlive(pid) ? pid : undefined;
  } catch {
    return undefined; // no pid file
  }
}

/**
 * Processes whose command line names the run's temp dir: conmon, containerd shims, containerd,
 * dockerd and crun of this run (their roots and sockets live there), never another run's.
 */
function runProcesses(dir: string): { pid: number; comm: string }[] {
  const out: { pid: number; comm: string }[] = [];
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if (argv.some((a) => a === dir || a.startsWith(`${dir}/`) || a.includes(`=${dir}/`) || a.includes(`://${dir}/`)))
        out.push({ pid, comm: readFileSync(`/proc/${pid}/comm`, 'utf8').trim() });
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

/** What a run left on the host after its own cleanup steps; empty means nothing. */
export async function findBenchLeaks(names: RunNames): Promise<string[]> {
  const { dir } = names;
  const leaks: string[] = [];
  if (existsSync(join(dir, 'dsec'))) {
    // findLeaks reports every `sb-` cgroup on the host; other dsec servers may run here, and theirs are not ours.
    const mine = (l: string): boolean =>
      !l.startsWith(`cgroup ${CGROUP_PARENT}/`) || l.startsWith(`cgroup ${CGROUP_PARENT}/${names.sandboxPrefix}`);
    leaks.push(...(await findLeaks(join(dir, 'dsec'), { includeLayers: true })).filter(mine));
  }
  for (const m of mountsUnder(dir)) {
    // The run's own dir on an overlay root: doctor's loop-mounted ext4 image over it, or the tmpfs
    // fallback (run-bench.ts's fixDataDirFs); the sweep, which runs after this check, unmounts it.
    // Only tmpfs was exempt, so on a fresh root (fresh-machine, dsec in a container) every bench
    // reported its own ext4 as a leak.
    if (m.mountPoint === dir && (m.fsType === 'tmpfs' || m.fsType === 'ext4')) continue;
    if (!leaks.some((l) => l.endsWith(m.mountPoint))) leaks.push(`mount ${m.mountPoint}`);
  }
  for (const root of crunRoots(dir)) {
    const r = await runTool('crun', ['--root', root, 'list', '--quiet']);
    for (const id of r.stdout.split('\n').filter(Boolean)) if (!leaks.includes(`crun container ${id}`)) leaks.push(`crun container ${id}`);
  }
  for (const cg of benchCgroups(names)) if (!leaks.includes(`cgroup ${cg}`)) leaks.push(`cgroup ${cg}`);
  const pid = dockerdPid(dir);
  if (pid) leaks.push(`dockerd pid ${pid}`);
  for (const p of runProcesses(dir)) if (p.pid !== pid) leaks.push(`process ${p.pid} (${p.comm})`);
  return leaks;
}

/**
 * The last resort, after every peer's own cleanup: stops the dockerd this run started (by the
 * PID it wrote), deletes containers left in the run's crun roots, unmounts everything under the
 * run's temp dir, removes the run's cgroups and the temp dir itself.
 */
export async function sweep(names: RunNames): Promise<void> {
  const { dir } = names;
  const pid = dockerdPid(dir);
  if (pid) {
    process.kill(pid, 'SIGTERM');
    for (let i = 0; i < 100 && dockerdPid(dir) === pid; i++) await new Promise((r) => setTimeout(r, 200));
    if (dockerdPid(dir) === pid) process.kill(pid, 'SIGKILL');
  }
  for (const root of crunRoots(dir)) {
    const r = await runTool('crun', ['--root', root, 'list', '--quiet']);
    for (const id of r.stdout.split('\n').filter(Boolean)) await runTool('crun', ['--root', root, 'delete', '-f', id]);
  }
  // What is still running with its roots or sockets in the run's dir (a shim or conmon whose daemon died first) is this run's.
  for (const p of runProcesses(dir)) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const m of mountsUnder(dir).reverse()) tryUnmount(m.mountPoint);
  for (const cg of benchCgroups(names)) removeCgroupTree(cg);
  if (mountsUnder(dir).length === 0) {
    rmSync(dir, { recursive: true, force: true });
    rmSync(dataDirImagePath(dir), { force: true }); // doctor's disk for the dir on an overlay root
  } else throw new Error(`${dir} still has mounts (${mountsUnder(dir).length}); left in place`);
}
