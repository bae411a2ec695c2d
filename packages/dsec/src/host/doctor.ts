import { accessSync, constants, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { CGROUP_ROOT } from './cgroups.js';
import { filesystemOf, readMounts } from './mounts.js';
import { LANDLOCK_BINARY, NFT_HELPER_BINARY } from './native-helpers.js';
import { landlockAbi, MS_NODEV, MS_NOSUID, mount } from './syscalls.js';

export interface Check {
  name: string;
  ok: boolean;
  detail: string;
  /** Set when doctor changed the host to make this check pass. */
  fixed?: string;
  /** Failing this check stops sandboxes from running at all. */
  required: boolean;
}

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
  if (!leftover) return { name, ok: true, detail: 'cgroup v1 controllers, none on the cgroup2 mount', required: true };
  const controllers = leftover.split(/\s+/);
  const fixed: string[] = [];
  for (const c of controllers) {
    const dir = join(CGROUP_ROOT, c);
    mkdirSync(dir, { recursive: true });
    try {
      mount('cgroup', dir, 'cgroup', MS_NOSUID | MS_NODEV, c);
      fixed.push(c);
    } catch (err) {
      return { name, ok: false, detail: `controller ${c} is on cgroup2 and could not be mounted as v1: ${(err as Error).message}`, required: true };
    }
  }
  return {
    name,
    ok: true,
    detail: 'hybrid cgroups: v1 controllers, cgroup2 now has none',
    fixed: `mounted v1 cgroup hierarchies for ${fixed.join(', ')} at ${fixed.map((c) => join(CGROUP_ROOT, c)).join(', ')} (crun refuses hybrid mode otherwise)`,
    required: true,
  };
}

/**
 * EROFS blobs on overlayfs cannot be mounted file-backed, and an overlayfs cannot be an overlay
 * upper dir. When the data dir sits on overlayfs (dsec itself running in a container), give it a
 * tmpfs: sandboxes work, but the data dir does not survive a reboot.
 */
function fixDataDirFs(dataDir: string): Check {
  const name = 'data dir filesystem';
  mkdirSync(dataDir, { recursive: true });
  const fs = filesystemOf(dataDir);
  if (fs !== 'overlay') return { name, ok: true, detail: `${dataDir} is on ${fs}`, required: true };
  if (readMounts().some((m) => m.mountPoint === dataDir && m.fsType === 'tmpfs')) {
    return { name, ok: true, detail: `${dataDir} is on tmpfs`, required: true };
  }
  try {
    mount('tmpfs', dataDir, 'tmpfs', MS_NOSUID | MS_NODEV, 'mode=0711,size=50%');
  } catch (err) {
    return { name, ok: false, detail: `${dataDir} is on overlayfs and a tmpfs could not be mounted: ${(err as Error).message}`, required: true };
  }
  return {
    name,
    ok: true,
    detail: `${dataDir} is on tmpfs`,
    fixed: `${dataDir} was on overlayfs, which can back neither EROFS layer files nor overlay upper dirs: mounted a tmpfs there (state will not survive a reboot)`,
    required: true,
  };
}

/** Checks the host can run sandboxes and applies the fixes it can; `fix: false` only looks. */
export function runDoctor(opts: { dataDir: string; fix?: boolean }): Check[] {
  const fix = opts.fix ?? true;
  const checks: Check[] = [];
  const isRoot = process.getuid?.() === 0;
  checks.push({ name: 'running as root', ok: isRoot, detail: isRoot ? 'uid 0' : 'dsec needs root for mounts, namespaces and cgroups', required: true });
  const fss = kernelFilesystems();
  for (const f of ['overlay', 'erofs', 'tmpfs']) {
    checks.push({ name: `kernel filesystem ${f}`, ok: fss.has(f), detail: fss.has(f) ? 'present' : `missing: load it with modprobe ${f}`, required: true });
  }
  const ns = ['pid', 'mnt', 'net', 'uts', 'ipc', 'cgroup'].filter((n) => !existsSync(`/proc/self/ns/${n}`));
  checks.push({ name: 'namespaces', ok: ns.length === 0, detail: ns.length ? `missing: ${ns.join(', ')}` : 'pid, mnt, net, uts, ipc, cgroup', required: true });
  for (const t of REQUIRED_TOOLS) {
    const p = which(t.tool);
    checks.push({ name: `tool ${t.tool}`, ok: !!p, detail: p ?? `missing: apt-get install ${t.pkg}`, required: t.required });
  }
  checks.push(chrootCheck());
  for (const [name, bin, required] of [
    ['dsec-landlock helper', LANDLOCK_BINARY, true],
    ['dsec-nft helper (network policies)', NFT_HELPER_BINARY, false],
  ] as const) {
    const ok = existsSync(bin);
    checks.push({ name, ok, detail: ok ? bin : `missing ${bin}: run scripts/setup`, required });
  }
  const abi = landlockAbi();
  checks.push({
    name: 'Landlock',
    ok: abi > 0,
    detail: abi > 0 ? `ABI ${abi}` : 'not available in this kernel: commands with writablePaths fail (exit 126) instead of running unconfined',
    required: false,
  });
  if (isRoot && fix) {
    checks.push(fixHybridCgroups());
    checks.push(fixDataDirFs(opts.dataDir));
  } else {
    const leftover = existsSync(join(CGROUP_ROOT, 'unified', 'cgroup.controllers')) ? readFileSync(join(CGROUP_ROOT, 'unified', 'cgroup.controllers'), 'utf8').trim() : '';
    checks.push({ name: 'cgroup layout usable by crun', ok: !leftover, detail: leftover ? `controllers on cgroup2: ${leftover} (run dsec doctor as root to fix)` : 'ok', required: true });
  }
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
