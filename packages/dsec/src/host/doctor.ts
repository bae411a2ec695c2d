import { accessSync, constants, existsSync, mkdirSync, readFileSync, realpathSync, symlinkSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { CGROUP_ROOT } from './cgroups.js';
import type { Check } from './host-check.js';
import { hostLimitChecks } from './host-limits.js';
import { fixDataDirFs } from './data-dir-fs.js';
import { mountIdOf } from './mounts.js';
import { CHUNK_FUSE_BINARY, LANDLOCK_BINARY, NFT_HELPER_BINARY } from './native-helpers.js';
import { restoreHostNull } from './private-null.js';
import { landlockAbi, MS_NODEV, MS_NOSUID, mount } from './syscalls.js';

export type { Check };

/** Debian packages dsec runs (scripts/setup installs them); the tool each provides. */
export const REQUIRED_TOOLS: { tool: string; pkg: string; required: boolean }[] = [
  { tool: 'crun', pkg: 'crun', required: true },
  { tool: 'mkfs.erofs', pkg: 'erofs-utils', required: true },
  { tool: 'catatonit', pkg: 'catatonit', required: true },
  { tool: 'busybox', pkg: 'busybox-static', required: true },
  { tool: 'debootstrap', pkg: 'debootstrap', required: false },
  { tool: 'nft', pkg: 'nftables', required: false },
  { tool: 'ip', pkg: 'iproute2', required: false },
];

export function which(tool: string): string | undefined {
  for (const dir of (process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(delimiter).concat(['/usr/sbin', '/sbin'])) {
    const p = join(dir, tool);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return undefined;
}

function kernelFilesystems(): Set<string> {
  return new Set(
    readFileSync('/proc/filesystems', 'utf8')
      .split('\n')
      .map((l) => l.trim().split(/\s+/).pop() ?? '')
      .filter(Boolean),
  );
}

/**
 * crun refuses hybrid cgroups when any v1 controller is only on the v2 mount ("cgroups in hybrid
 * mode not supported, drop all controllers from cgroupv2"). On these hosts that is hugetlb: mount
 * it as a v1 hierarchy and cgroup2 is left with no controllers.
 */
function fixHybridCgroups(): Check {
  const name = 'cgroup layout usable by crun';
  const v2 = join(CGROUP_ROOT, 'unified', 'cgroup.controllers');
  const isV1 = existsSync(join(CGROUP_ROOT, 'memory', 'memory.limit_in_bytes'));
  if (!isV1) {
    const pure2 = existsSync(join(CGROUP_ROOT, 'cgroup.controllers'));
    return { name, ok: pure2, detail: pure2 ? 'cgroup v2' : 'no memory cgroup controller found', required: true };
  }
  const leftover = existsSync(v2) ? readFileSync(v2, 'utf8').trim() : '';
  // A controller may sit on a v1 hierarchy mounted only in another mount namespace (another dsec's
  // container): cgroup2 then shows none, yet crun finds a plain directory where it looks and
  // writes files into it, and every killed sandbox leaves a directory there.
  const procCgroups = readFileSync('/proc/cgroups', 'utf8');
  const controllers = leftover ? leftover.split(/\s+/) : unmountedV1Controllers(procCgroups, cgroupMounts());
  if (controllers.length === 0)
    return { name, ok: true, detail: 'cgroup v1 controllers, each mounted where crun looks, none on the cgroup2 mount', required: true };
  // Controllers on cgroup2 get a v1 hierarchy each; ones the kernel has bound to a v1 hierarchy
  // already are mounted as that hierarchy, all its controllers together (mounting `cpu` alone when
  // the hierarchy is cpu,cpuacct is EBUSY), at the dir crun names it by, with links for the others.
  const groups = leftover ? controllers.map((c) => ({ dir: c, controllers: [c] })) : v1MountGroups(procCgroups, controllers);
  const fixed: string[] = [];
  for (const g of groups) {
    const dir = join(CGROUP_ROOT, g.dir);
    try {
      mkdirSync(dir, { recursive: true });
      mount('cgroup', dir, 'cgroup', MS_NOSUID | MS_NODEV, g.controllers.join(','));
      for (const c of g.controllers) if (c !== g.dir && !existsSync(join(CGROUP_ROOT, c))) symlinkSync(g.dir, join(CGROUP_ROOT, c));
      fixed.push(g.dir);
    } catch (err) {
      const where = leftover ? 'is on cgroup2 and' : 'is not mounted where crun looks and';
      return {
        name,
        ok: false,
        detail: `controller ${g.dir} ${where} could not be mounted as v1 at ${dir}: ${(err as Error).message}`,
        required: true,
      };
    }
  }
  return {
    name,
    ok: true,
    detail: 'hybrid cgroups: v1 controllers, cgroup2 now has none',
    fixed: `mounted v1 cgroup hierarchies for ${fixed.join(', ')} at ${fixed.map((c) => join(CGROUP_ROOT, c)).join(', ')} (${
      leftover ? 'crun refuses hybrid mode otherwise' : 'they were not mounted in this mount namespace, where crun looks for them'
    })`,
    required: true,
  };
}

/**
 * The v1 hierarchies `missing` controllers are bound to (`/proc/cgroups`' hierarchy ids), each with
 * all its controllers in the kernel's order and the dir crun looks for it at (`cpu,cpuacct`).
 */
export function v1MountGroups(procCgroups: string, missing: readonly string[]): { dir: string; controllers: string[] }[] {
  const byHierarchy = new Map<string, string[]>();
  for (const { name, hierarchy } of boundV1Controllers(procCgroups))
    byHierarchy.set(hierarchy, [...(byHierarchy.get(hierarchy) ?? []), name]);
  const groups = [...byHierarchy.values()].filter((cs) => cs.some((c) => missing.includes(c)));
  return groups.map((cs) => ({ dir: cs.join(','), controllers: cs }));
}

/** The controllers `/proc/cgroups` lists as enabled and bound to a v1 hierarchy (id > 0), in the kernel's order. */
function boundV1Controllers(procCgroups: string): { name: string; hierarchy: string }[] {
  const out: { name: string; hierarchy: string }[] = [];
  for (const line of procCgroups.split('\n')) {
    const [name, hierarchy, , enabled] = line.trim().split(/\s+/);
    if (!name || name.startsWith('#') || !hierarchy || hierarchy === '0' || enabled !== '1') continue;
    out.push({ name, hierarchy });
  }
  return out;
}

/** A cgroup v1 mount: its id (mountinfo's first field), where, and which controllers (the super options). */
export interface CgroupMount {
  id: number;
  mountPoint: string;
  controllers: string[];
}

/** cgroup v1 mounts in this mount namespace, hidden ones (mounted over) included. */
function cgroupMounts(): CgroupMount[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' - '))
    .filter(([, post]) => post?.startsWith('cgroup '))
    .map(([pre, post]) => {
      const fields = pre!.split(' ');
      return { id: Number(fields[0]), mountPoint: fields[4] ?? '', controllers: (post!.split(' ')[2] ?? '').split(',') };
    });
}

/** How unmountedV1Controllers looks at paths: this host's, or a test's table. */
export interface HostPaths {
  /** The path with its links followed; itself when absent. */
  resolve(path: string): string;
  /** The id of the mount visible at the path, undefined when absent. */
  mountIdAt(path: string): number | undefined;
}

const realHost: HostPaths = {
  resolve: (path) => {
    try {
      return realpathSync(path);
    } catch {
      return path; // absent: no mount can be there
    }
  },
  mountIdAt: mountIdOf,
};

/**
 * Controllers the kernel has bound to a v1 hierarchy (`/proc/cgroups`: hierarchy > 0, enabled)
 * that are not mounted at CGROUP_ROOT/<name> (or where that symlink points, as cpu → cpu,cpuacct).
 * What counts is the mount visible there (`mountIdAt`), not a line of mountinfo with that mount
 * point: in a container whose /sys/fs/cgroup is a tmpfs over the host's, the host's hierarchies
 * are still listed at the same paths, hidden, after the container's own are unmounted.
 */
export function unmountedV1Controllers(procCgroups: string, mounts: CgroupMount[], host: HostPaths = realHost): string[] {
  const missing: string[] = [];
  for (const { name } of boundV1Controllers(procCgroups)) {
    const where = host.resolve(join(CGROUP_ROOT, name));
    const visible = host.mountIdAt(where);
    if (!mounts.some((m) => m.id === visible && m.mountPoint === where && m.controllers.includes(name))) missing.push(name);
  }
  return missing;
}

/**
 * Checks the host can run sandboxes and applies the fixes it can; `fix: false` only looks.
 * With `maxSandboxes`, also the host limits that many sandboxes need (host-limits.ts).
 */
export function runDoctor(opts: { dataDir: string; fix?: boolean; maxSandboxes?: number }): Check[] {
  const fix = opts.fix ?? true;
  const checks: Check[] = [];
  const isRoot = process.getuid?.() === 0;
  checks.push({
    name: 'running as root',
    ok: isRoot,
    detail: isRoot ? 'uid 0' : 'dsec needs root for mounts, namespaces and cgroups',
    required: true,
  });
  const fss = kernelFilesystems();
  for (const f of ['overlay', 'erofs', 'tmpfs']) {
    checks.push({
      name: `kernel filesystem ${f}`,
      ok: fss.has(f),
      detail: fss.has(f) ? 'present' : `missing: load it with modprobe ${f}`,
      required: true,
    });
  }
  const ns = ['pid', 'mnt', 'net', 'uts', 'ipc', 'cgroup'].filter((n) => !existsSync(`/proc/self/ns/${n}`));
  checks.push({
    name: 'namespaces',
    ok: ns.length === 0,
    detail: ns.length ? `missing: ${ns.join(', ')}` : 'pid, mnt, net, uts, ipc, cgroup',
    required: true,
  });
  for (const t of REQUIRED_TOOLS) {
    const p = which(t.tool);
    checks.push({ name: `tool ${t.tool}`, ok: !!p, detail: p ?? `missing: apt-get install ${t.pkg}`, required: t.required });
  }
  checks.push(chrootCheck());
  for (const [name, bin, required] of [
    ['dsec-landlock helper', LANDLOCK_BINARY, true],
    ['dsec-nft helper (network policies)', NFT_HELPER_BINARY, false],
    ['dsec-chunk-fuse (--layer-fetch lazy)', CHUNK_FUSE_BINARY, false],
  ] as const) {
    const ok = existsSync(bin);
    checks.push({ name, ok, detail: ok ? bin : `missing ${bin}: run scripts/setup`, required });
  }
  const fuse = existsSync('/dev/fuse');
  checks.push({
    name: 'FUSE (/dev/fuse)',
    ok: fuse,
    detail: fuse ? 'present' : 'absent: --layer-fetch lazy cannot mount layers; eager works',
    required: false,
  });
  const abi = landlockAbi();
  checks.push({
    name: 'Landlock',
    ok: abi > 0,
    detail:
      abi > 0 ? `ABI ${abi}` : 'not available in this kernel: commands with writablePaths fail (exit 126) instead of running unconfined',
    required: false,
  });
  if (isRoot && fix) {
    const devNull = restoreHostNull();
    checks.push({
      name: "host /dev/null is root's",
      ok: devNull.ok,
      detail: devNull.detail,
      ...(devNull.fixed ? { fixed: devNull.fixed } : {}),
      required: false,
    });
    checks.push(fixHybridCgroups());
    checks.push(fixDataDirFs(opts.dataDir));
  } else {
    const leftover = existsSync(join(CGROUP_ROOT, 'unified', 'cgroup.controllers'))
      ? readFileSync(join(CGROUP_ROOT, 'unified', 'cgroup.controllers'), 'utf8').trim()
      : '';
    const unmounted =
      leftover || !existsSync(join(CGROUP_ROOT, 'memory'))
        ? []
        : unmountedV1Controllers(readFileSync('/proc/cgroups', 'utf8'), cgroupMounts());
    const detail = leftover
      ? `controllers on cgroup2: ${leftover} (run dsec doctor as root to fix)`
      : unmounted.length
        ? `v1 controllers not mounted where crun looks: ${unmounted.map((c) => join(CGROUP_ROOT, c)).join(', ')} (run dsec doctor as root to fix)`
        : 'ok';
    checks.push({ name: 'cgroup layout usable by crun', ok: !leftover && unmounted.length === 0, detail, required: true });
  }
  if (opts.maxSandboxes) checks.push(...hostLimitChecks({ maxSandboxes: opts.maxSandboxes, fix: isRoot && fix }));
  return checks;
}

/**
 * In a chroot (not a mount namespace with its own root), crun cannot pivot_root into a sandbox
 * and falls back to chroot, which leaves the sandbox's mount namespace rooted at the host's
 * root: `crun exec` then lands there, outside the sandbox's files. Seen with chroot-based test
 * rigs; real hosts and containers with their own mount namespace are fine.
 */
function chrootCheck(): Check {
  // mountinfo lists mount points relative to this process's root. A root that is the root of
  // its filesystem's mount has a "/" line whose root field is "/"; a chroot into a plain
  // directory has no "/" line, and one into a bind-mounted directory shows that directory.
  const line = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .find((f) => f[4] === '/');
  const rootOk = line?.[3] === '/';
  return {
    name: 'root is a mount (not a chroot)',
    ok: rootOk,
    detail: rootOk
      ? '/ is the root of its mount'
      : `/ is a chroot (${line ? `of ${line[3]}` : 'not a mount'}): crun cannot pivot_root and \`crun exec\` would run commands in the host's root instead of the sandbox's; run dsec in a mount namespace whose root is a mount`,
    required: false,
  };
}

export function doctorPassed(checks: Check[]): boolean {
  return checks.every((c) => c.ok || !c.required);
}

export function formatChecks(checks: Check[]): string {
  return checks
    .map((c) => `${c.ok ? 'ok  ' : c.required ? 'FAIL' : 'warn'}  ${c.name}: ${c.detail}${c.fixed ? `\n      fixed: ${c.fixed}` : ''}`)
    .join('\n');
}
