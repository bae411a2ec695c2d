/**
 * `dsec doctor`'s fixes for hosts where dsec runs inside a container: a data dir on an overlay
 * root with no room for a disk image (data-dir-disk.test.ts) gets the fallback tmpfs, on which
 * device nodes work (debootstrap makes and opens them), and a cgroup v1
 * controller mounted only in another mount namespace is mounted where crun looks for it.
 * Both run against real mounts: an overlayfs made here, and a private mount namespace (unshare)
 * in which the hugetlb hierarchy is unmounted, as it is beside another dsec's container.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fixDataDirFs } from '../../src/host/data-dir-fs.js';
import { unmountedV1Controllers, v1MountGroups } from '../../src/host/doctor.js';
import { readMounts } from '../../src/host/mounts.js';
import { MS_NODEV, MS_NOSUID, mount, umount } from '../../src/host/syscalls.js';

const rootSkip = process.getuid?.() === 0 ? undefined : 'needs root (mounts)';

/** Makes a character device like /dev/null and opens it for writing, as debootstrap's check does. */
function deviceNodeWorks(dir: string): string {
  mkdirSync(dir, { recursive: true });
  const node = join(dir, 'test-dev-null');
  rmSync(node, { force: true });
  const r = spawnSync('mknod', ['-m', '666', node, 'c', '1', '3'], { encoding: 'utf8' });
  if (r.status !== 0) return `mknod: ${r.stderr.trim()}`;
  try {
    closeSync(openSync(node, 'w'));
    return 'ok';
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? String(err);
  } finally {
    rmSync(node, { force: true });
  }
}

describe('doctor: a data dir on an overlay root', { skip: rootSkip, timeout: 60_000 }, () => {
  let base = '';
  let merged = '';
  let dataDir = '';
  const mounted = (dir: string) => readMounts().findLast((m) => m.mountPoint === dir);

  before(() => {
    base = mkdtempSync('/var/tmp/dsec-test-overlayroot-');
    // The overlay's own dirs on a tmpfs: /var/tmp may be overlayfs itself (dsec's tests in a
    // container), which cannot be an overlay's upper dir. 64 MiB is below the smallest disk image
    // doctor makes (IMAGE_MIN_BYTES), so it falls back to a tmpfs.
    mount('tmpfs', base, 'tmpfs', MS_NOSUID | MS_NODEV, 'mode=0700,size=64m');
    for (const d of ['lower', 'upper', 'work', 'merged']) mkdirSync(join(base, d));
    merged = join(base, 'merged');
    mount('overlay', merged, 'overlay', 0, `lowerdir=${join(base, 'lower')},upperdir=${join(base, 'upper')},workdir=${join(base, 'work')}`);
    dataDir = join(merged, 'data');
  });
  after(() => {
    while (dataDir && mounted(dataDir)) umount(dataDir);
    if (merged && mounted(merged)) umount(merged);
    if (base && mounted(base)) umount(base);
    if (base && !readMounts().some((m) => m.mountPoint.startsWith(`${base}/`))) rmSync(base, { recursive: true, force: true });
  });

  test('without room for a disk image, the tmpfs doctor mounts instead lets a build use the device nodes it makes', () => {
    const check = fixDataDirFs(dataDir);
    assert.equal(check.ok, true, check.detail);
    assert.match(check.fixed ?? '', /no disk image could be mounted there \(less than .* GiB free .*\): mounted a tmpfs instead/);
    assert.ok(!existsSync(`${dataDir}.img`), 'no image is left behind');
    const m = mounted(dataDir);
    assert.equal(m?.fsType, 'tmpfs');
    assert.ok(!m.options.includes('nodev'), `mounted with ${m.options.join(',')}`);
    assert.ok(m.options.includes('nosuid'));
    assert.equal(deviceNodeWorks(join(dataDir, 'tmp', 'build')), 'ok');
  });

  test('a nodev tmpfs an older doctor mounted is remounted without nodev', () => {
    umount(dataDir);
    mount('tmpfs', dataDir, 'tmpfs', MS_NOSUID | MS_NODEV, 'mode=0711,size=64m');
    assert.equal(deviceNodeWorks(join(dataDir, 'tmp')), 'EACCES', 'a nodev tmpfs must refuse the device (else this test proves nothing)');
    const check = fixDataDirFs(dataDir);
    assert.equal(check.ok, true, check.detail);
    assert.match(check.fixed ?? '', /without nodev/);
    assert.equal(deviceNodeWorks(join(dataDir, 'tmp')), 'ok');
    assert.equal(fixDataDirFs(dataDir).fixed, undefined, 'a second run changes nothing');
  });
});

describe('doctor: cgroup v1 hierarchies where crun looks', () => {
  const procCgroups =
    '#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t13\t1\ncpuacct\t1\t13\t1\nnet_cls\t0\t13\t1\nhugetlb\t10\t13\t1\n';

  test('a controller bound to a hierarchy that is not mounted here is reported', () => {
    // A table of what is visible where, not this host's (whose layout differs between machines).
    const root = '/sys/fs/cgroup';
    const visibleAt = new Map<string, number>();
    const at = { resolve: (p: string) => p, mountIdAt: (p: string) => visibleAt.get(p) };
    const cpu = { id: 31, mountPoint: '/sys/fs/cgroup/cpu', controllers: ['rw', 'cpu', 'cpuacct'] };
    visibleAt.set(`${root}/cpu`, 31);
    // cpuacct is looked for at /sys/fs/cgroup/cpuacct, which does not resolve to the cpu,cpuacct mount here.
    assert.deepEqual(unmountedV1Controllers(procCgroups, [cpu], at), ['cpuacct', 'hugetlb']);
    const cpuacct = { id: 32, mountPoint: '/sys/fs/cgroup/cpuacct', controllers: ['rw', 'cpu', 'cpuacct'] };
    const hugetlbMount = { id: 33, mountPoint: '/sys/fs/cgroup/hugetlb', controllers: ['rw', 'hugetlb'] };
    visibleAt.set(`${root}/cpuacct`, 32);
    visibleAt.set(`${root}/hugetlb`, 33);
    assert.deepEqual(unmountedV1Controllers(procCgroups, [cpu, cpuacct, hugetlbMount], at), []);
    // A container's /sys/fs/cgroup is a tmpfs over the host's: the host's hugetlb mount is still
    // listed at that path, hidden; what is visible there is the tmpfs's plain directory (id 40).
    visibleAt.set(`${root}/hugetlb`, 40);
    assert.deepEqual(unmountedV1Controllers(procCgroups, [cpu, cpuacct, hugetlbMount], at), ['hugetlb']);
  });

  test('a hierarchy two controllers share is mounted whole, at the dir crun names it by', () => {
    // cpu and cpuacct share hierarchy 1: mounting `cpu` alone would be EBUSY.
    assert.deepEqual(v1MountGroups(procCgroups, ['cpuacct', 'hugetlb']), [
      { dir: 'cpu,cpuacct', controllers: ['cpu', 'cpuacct'] },
      { dir: 'hugetlb', controllers: ['hugetlb'] },
    ]);
    assert.deepEqual(v1MountGroups(procCgroups, []), []);
  });

  const hugetlb = '/sys/fs/cgroup/hugetlb';
  const skip =
    rootSkip ??
    (readMounts().some((m) => m.mountPoint === hugetlb && m.fsType === 'cgroup')
      ? undefined
      : `no v1 hugetlb hierarchy at ${hugetlb} on this host`);

  test('doctor mounts hugetlb when another mount namespace holds it', { skip, timeout: 60_000 }, () => {
    const dataDir = mkdtempSync('/var/tmp/dsec-test-doctor-');
    try {
      const doctor = new URL('../../src/host/doctor.js', import.meta.url).pathname;
      const script = `
        import { execFileSync } from 'node:child_process';
        import { existsSync } from 'node:fs';
        const { runDoctor } = await import(${JSON.stringify(doctor)});
        execFileSync('umount', [${JSON.stringify(hugetlb)}]);
        // What is visible there, not a line of mountinfo: under a tmpfs over the host's cgroup
        // mounts (a container's, fresh-machine's) the host's hugetlb stays listed, hidden.
        const isMounted = () => existsSync(${JSON.stringify(hugetlb + '/cgroup.procs')});
        const before = isMounted();
        const checks = runDoctor({ dataDir: ${JSON.stringify(dataDir)}, fix: true });
        console.log(JSON.stringify({ before, after: isMounted(), check: checks.find((c) => c.name === 'cgroup layout usable by crun') }));
      `;
      // A private mount namespace: the host's own hugetlb mount is never touched.
      const r = spawnSync('unshare', ['--mount', '--propagation', 'private', process.execPath, '--input-type=module', '-e', script], {
        encoding: 'utf8',
      });
      assert.equal(r.status, 0, r.stderr);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as {
        before: boolean;
        after: boolean;
        check: { ok: boolean; fixed?: string };
      };
      assert.equal(out.before, false, 'the hierarchy must be gone in the namespace first');
      assert.equal(out.after, true, 'doctor did not mount hugetlb where crun looks');
      assert.equal(out.check.ok, true);
      assert.match(out.check.fixed ?? '', /hugetlb.*not mounted in this mount namespace/);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
    assert.ok(existsSync(join(hugetlb, 'cgroup.procs')), "the host's own hierarchy is untouched");
  });
});
