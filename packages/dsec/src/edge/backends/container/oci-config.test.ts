import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { ImageConfig } from '@dsec/sdk/schema';
import { DEFAULT_CAPABILITIES, INIT_BINARY, INIT_PATH, buildOciConfig, cgroupMounts, processBlock } from './oci-config.js';
import { CPU_PERIOD_US } from '../../../host/cgroups.js';
import { mergeEnv, parseUser } from '../shared/user-env.js';

const image: ImageConfig = {
  env: ['PATH=/usr/bin:/bin', 'HOME=/root', 'LANG=C'],
  cwd: '/work',
  user: '1000:1000',
  entrypoint: [],
  cmd: ['/bin/sh'],
  labels: {},
};

type Config = {
  process: {
    args: string[];
    env: string[];
    cwd: string;
    user: { uid: number; gid: number };
    noNewPrivileges: boolean;
    capabilities: Record<string, string[]>;
  };
  root: { path: string; readonly: boolean };
  hostname: string;
  mounts: { destination: string; type: string; source: string; options?: string[] }[];
  linux: {
    namespaces: { type: string }[];
    cgroupsPath: string;
    resources: {
      memory: { limit: number; swap: number };
      pids: { limit: number };
      cpu: { shares: number; quota: number; period: number };
      devices: { allow: boolean; access: string }[];
    };
    maskedPaths: string[];
    readonlyPaths: string[];
  };
};

const build = (limits = { cpu: 1, memoryMiB: 512, pids: 512 }, env: Record<string, string> = {}): Config =>
  buildOciConfig({ id: 'sb-local-abcdefghijklm', config: image, env, limits }) as unknown as Config;

describe('buildOciConfig', () => {
  test('creates pid, network, ipc, uts, mount and cgroup namespaces, and no user namespace', () => {
    const types = build()
      .linux.namespaces.map((n) => n.type)
      .sort();
    assert.deepEqual(types, ['cgroup', 'ipc', 'mount', 'network', 'pid', 'uts']);
  });

  test('with userns: joins the namespace dsec-idmap made, maps 0..size-1 to the range, and ping_group_range stays inside it', () => {
    const c = buildOciConfig({
      id: 'sb-local-abcdefghijklm',
      config: image,
      env: {},
      limits: { cpu: 1, memoryMiB: 512, pids: 512 },
      userns: { path: '/x/userns', base: 2 ** 30, size: 65536 },
    }) as unknown as {
      linux: { namespaces: { type: string; path?: string }[]; uidMappings: unknown; gidMappings: unknown; sysctl: Record<string, string> };
    };
    assert.deepEqual(c.linux.namespaces[0], { type: 'user', path: '/x/userns' });
    assert.deepEqual(c.linux.uidMappings, [{ containerID: 0, hostID: 2 ** 30, size: 65536 }]);
    assert.deepEqual(c.linux.gidMappings, c.linux.uidMappings);
    assert.equal(c.linux.sysctl['net.ipv4.ping_group_range'], '0 65535');
  });

  test('puts the sandbox cgroup under /dsec/<id>', () => {
    assert.equal(build().linux.cgroupsPath, '/dsec/sb-local-abcdefghijklm');
  });

  test('memory limit is memoryMiB in bytes, with swap equal to it (no extra swap)', () => {
    const r = build({ cpu: 1, memoryMiB: 64, pids: 100 }).linux.resources;
    assert.equal(r.memory.limit, 64 * 1024 * 1024);
    assert.equal(r.memory.swap, 64 * 1024 * 1024);
  });

  test('pids limit is passed as is', () => {
    assert.equal(build({ cpu: 1, memoryMiB: 64, pids: 100 }).linux.resources.pids.limit, 100);
  });

  test('cpu: 1024 shares and one period of quota per core', () => {
    const cpu = build({ cpu: 2, memoryMiB: 64, pids: 100 }).linux.resources.cpu;
    assert.deepEqual(cpu, { shares: 2048, quota: 2 * CPU_PERIOD_US, period: CPU_PERIOD_US });
  });

  test('fractional cpu rounds shares and quota; shares never go below 2', () => {
    const half = build({ cpu: 0.5, memoryMiB: 64, pids: 100 }).linux.resources.cpu;
    assert.equal(half.shares, 512);
    assert.equal(half.quota, 50_000);
    const tiny = build({ cpu: 0.001, memoryMiB: 64, pids: 100 }).linux.resources.cpu;
    assert.equal(tiny.shares, 2);
  });

  test('all devices are denied by default', () => {
    assert.deepEqual(build().linux.resources.devices, [{ allow: false, access: 'rwm' }]);
  });

  test('the init process is catatonit at INIT_PATH, run as root from /', () => {
    const p = build().process;
    assert.deepEqual(p.args, [INIT_PATH, '-P']);
    assert.equal(p.cwd, '/');
    assert.deepEqual(p.user, { uid: 0, gid: 0 });
  });

  test('the init binary is bind-mounted read-only from the host', () => {
    const m = build().mounts.find((x) => x.destination === INIT_PATH);
    assert.ok(m);
    assert.equal(m.source, INIT_BINARY);
    assert.ok(m.options?.includes('ro'));
    assert.ok(m.options?.includes('bind'));
  });

  test('proc, dev, sys and the cgroup filesystem are mounted; sys and cgroup read-only', () => {
    const mounts = build().mounts;
    const by = (d: string) => mounts.find((m) => m.destination === d);
    assert.equal(by('/proc')?.type, 'proc');
    assert.equal(by('/dev')?.type, 'tmpfs');
    assert.ok(by('/sys')?.options?.includes('ro'));
    assert.ok(by('/sys/fs/cgroup')?.options?.includes('ro'));
  });

  test("v1 hierarchies are bound read-only from the sandbox's own cgroup dirs on a read-only tmpfs (crun mounts no cgroupfs, and makes no symlinks, of its own)", () => {
    const c = buildOciConfig({
      id: 'sb-local-abcdefghijklm',
      config: image,
      env: {},
      limits: { cpu: 1, memoryMiB: 512, pids: 512 },
      cgroupParent: 'bench-x',
      cgroupHierarchies: ['cpu,cpuacct', 'memory', 'systemd'],
    }) as unknown as Config;
    assert.equal(c.linux.cgroupsPath, '/bench-x/sb-local-abcdefghijklm');
    const cgroupAt = c.mounts.findIndex((m) => m.destination === '/sys/fs/cgroup');
    assert.equal(c.mounts[cgroupAt]?.type, 'tmpfs', "crun's own cgroup mount would put its symlinks (cpu → cpu,cpuacct) where binds go");
    assert.ok(c.mounts[cgroupAt]?.options?.includes('ro'));
    const binds = c.mounts.slice(cgroupAt + 1).filter((m) => m.destination.startsWith('/sys/fs/cgroup/'));
    const dir = (h: string) => `/sys/fs/cgroup/${h}/bench-x/sb-local-abcdefghijklm`;
    assert.deepEqual(
      binds.map((m) => [m.destination, m.type, m.source]),
      [
        ['/sys/fs/cgroup/cpu,cpuacct', 'bind', dir('cpu,cpuacct')],
        ['/sys/fs/cgroup/memory', 'bind', dir('memory')],
        ['/sys/fs/cgroup/systemd', 'bind', dir('systemd')],
        // A shared hierarchy under each of its names too, as the host has them (as symlinks).
        ['/sys/fs/cgroup/cpu', 'bind', dir('cpu,cpuacct')],
        ['/sys/fs/cgroup/cpuacct', 'bind', dir('cpu,cpuacct')],
      ],
    );
    for (const b of binds)
      for (const o of ['ro', 'nosuid', 'noexec', 'nodev']) assert.ok(b.options?.includes(o), `${b.destination} lacks ${o}`);
    // Separate cpu and cpuacct hierarchies (this host's layout): one bind each, no alias.
    const separate = cgroupMounts(['cpu', 'cpuacct'], '/dsec/x').map((m) => m['destination']);
    assert.deepEqual(separate, ['/sys/fs/cgroup', '/sys/fs/cgroup/cpu', '/sys/fs/cgroup/cpuacct']);
    const none = build().mounts;
    assert.equal(none.find((m) => m.destination === '/sys/fs/cgroup')?.type, 'cgroup', 'crun mounts cgroup2 itself on a cgroup2-only host');
    assert.equal(none.filter((m) => m.destination.startsWith('/sys/fs/cgroup/')).length, 0, 'no binds without hierarchies');
  });

  test('the init env is the image env merged with the create env', () => {
    const env = build(undefined, { LANG: 'C.UTF-8', EXTRA: '1' }).process.env;
    assert.deepEqual(env, ['PATH=/usr/bin:/bin', 'HOME=/root', 'LANG=C.UTF-8', 'EXTRA=1']);
  });

  test('hostname is the last 12 characters of the id', () => {
    assert.equal(build().hostname, 'bcdefghijklm');
  });

  test('the root filesystem is the bundle rootfs, writable', () => {
    assert.deepEqual(build().root, { path: 'rootfs', readonly: false });
  });

  test('sensitive /proc and /sys paths are masked or read-only', () => {
    const l = build().linux;
    for (const p of ['/proc/kcore', '/proc/keys', '/sys/firmware']) assert.ok(l.maskedPaths.includes(p), p);
    for (const p of ['/proc/sys', '/proc/sysrq-trigger']) assert.ok(l.readonlyPaths.includes(p), p);
  });

  test("with the node's stubs: masked directories are the empty stub bound read-only after /proc and /sys, and /sys/fs/cgroup's root is the cgroup stub (no tmpfs for either)", () => {
    const stubs = { emptyDir: '/n/stubs/empty', cgroupRoot: '/n/stubs/cgroup', maskedDirs: ['/proc/acpi', '/sys/firmware'] };
    const c = buildOciConfig({
      id: 'sb-local-abcdefghijklm',
      config: image,
      env: {},
      limits: { cpu: 1, memoryMiB: 512, pids: 512 },
      cgroupHierarchies: ['memory'],
      stubs,
    }) as unknown as Config;
    const at = (d: string) => c.mounts.findIndex((m) => m.destination === d);
    for (const d of stubs.maskedDirs) {
      const m = c.mounts[at(d)];
      assert.deepEqual([m?.type, m?.source], ['bind', stubs.emptyDir], d);
      for (const o of ['ro', 'nosuid', 'noexec', 'nodev']) assert.ok(m?.options?.includes(o), `${d} lacks ${o}`);
      assert.ok(!c.linux.maskedPaths.includes(d), `${d} is masked by crun too (a tmpfs)`);
    }
    assert.ok(
      at('/proc/acpi') > at('/proc') && at('/sys/firmware') > at('/sys'),
      'a mask bound before its filesystem is mounted would be hidden by it',
    );
    // Files are still masked by crun (it binds /dev/null: no superblock).
    for (const p of ['/proc/kcore', '/proc/keys']) assert.ok(c.linux.maskedPaths.includes(p), p);
    const root = c.mounts[at('/sys/fs/cgroup')];
    assert.deepEqual([root?.type, root?.source], ['bind', stubs.cgroupRoot]);
    assert.ok(root?.options?.includes('ro'));
    assert.ok(at('/sys/fs/cgroup/memory') > at('/sys/fs/cgroup'));
    assert.equal(
      c.mounts
        .filter((m) => m.type === 'tmpfs')
        .map((m) => m.destination)
        .join(' '),
      '/dev /dev/shm',
    );
  });
});

describe('processBlock', () => {
  const p = processBlock({ args: ['a'], env: ['A=1'], cwd: '/x', user: { uid: 5, gid: 6 } }) as Config['process'] & {
    terminal: boolean;
    rlimits: { type: string; hard: number; soft: number }[];
  };

  test('sets noNewPrivileges and no terminal', () => {
    assert.equal(p.noNewPrivileges, true);
    assert.equal(p.terminal, false);
  });

  test("grants Docker's default capabilities only: no CAP_SYS_ADMIN, SYS_PTRACE, NET_ADMIN, SYS_MODULE", () => {
    for (const set of ['bounding', 'effective', 'permitted']) {
      assert.deepEqual(p.capabilities[set], DEFAULT_CAPABILITIES, set);
    }
    for (const cap of ['CAP_SYS_ADMIN', 'CAP_SYS_PTRACE', 'CAP_NET_ADMIN', 'CAP_SYS_MODULE', 'CAP_SYS_TIME', 'CAP_SYS_RAWIO']) {
      assert.ok(!DEFAULT_CAPABILITIES.includes(cap), cap);
    }
  });

  test('passes args, env, cwd and user through', () => {
    assert.deepEqual(p.args, ['a']);
    assert.deepEqual(p.env, ['A=1']);
    assert.equal(p.cwd, '/x');
    assert.deepEqual(p.user, { uid: 5, gid: 6 });
  });

  test('limits open files', () => {
    assert.deepEqual(p.rlimits, [{ type: 'RLIMIT_NOFILE', hard: 20000, soft: 20000 }]);
  });
});

describe('mergeEnv', () => {
  test('later sources override earlier ones, keeping the order of first appearance', () => {
    assert.deepEqual(mergeEnv(['A=1', 'B=2'], { B: '3', C: '4' }, { A: '5' }), ['A=5', 'B=3', 'C=4']);
  });

  test('values may contain "=" and be empty', () => {
    assert.deepEqual(mergeEnv(['OPTS=a=b=c', 'EMPTY=']), ['OPTS=a=b=c', 'EMPTY=']);
  });

  test('base entries without a name (no "=" or a leading "=") are dropped', () => {
    assert.deepEqual(mergeEnv(['NOEQUALS', '=value', 'OK=1']), ['OK=1']);
  });

  test('a duplicate in the base keeps the last value', () => {
    assert.deepEqual(mergeEnv(['A=1', 'A=2']), ['A=2']);
  });

  test('no sources gives an empty env', () => {
    assert.deepEqual(mergeEnv([]), []);
  });
});

describe('parseUser', () => {
  test('"uid" uses the uid as gid', () => {
    assert.deepEqual(parseUser('1000'), { uid: 1000, gid: 1000 });
  });

  test('"uid:gid" sets both', () => {
    assert.deepEqual(parseUser('1000:100'), { uid: 1000, gid: 100 });
    assert.deepEqual(parseUser('0:0'), { uid: 0, gid: 0 });
  });

  test('surrounding whitespace is ignored', () => {
    assert.deepEqual(parseUser(' 65534:65534 '), { uid: 65534, gid: 65534 });
  });
});
