/**
 * Starts a real all-in-one dsec (control plane + local edge on crun) for integration tests, on a
 * fresh data dir under /var/tmp, and tears it down with a leak check. Nothing here is mocked.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmdirSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { after, before } from 'node:test';
import { Sandbox, type CreateOptions } from '@dsec/sdk';
import { compileOptions } from '../../src/config/options.js';
import { findLeaks } from '../../src/host/leak-check.js';
import { filesystemOf, readMounts } from '../../src/host/mounts.js';
import { MNT_DETACH, umount } from '../../src/host/syscalls.js';
import { fixDataDirFs } from '../../src/host/data-dir-fs.js';
import { dataDirImagePath, loopBackingFile } from '../../src/host/data-dir-image.js';
import { which } from '../../src/host/doctor.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startAllInOne, type RunningDsec } from '../../src/runtime/all-in-one.js';
import { TEST_STORE_POSTGRES, testStoreLocation } from './postgres.js';

export const DATA_DIR_PREFIX = '/var/tmp/dsec-test-';

/**
 * Why integration tests cannot run on this machine, or undefined when they can. Tests pass it as
 * `skip` so the runner prints the reason.
 */
export function integrationSkipReason(): string | undefined {
  if (process.platform !== 'linux') return 'integration tests need Linux';
  if (process.getuid?.() !== 0) return 'integration tests need root (mounts, namespaces, cgroups); run the suite as root';
  for (const tool of ['crun', 'mkfs.erofs', 'catatonit', 'busybox']) {
    if (!which(tool)) return `integration tests need ${tool} on PATH`;
  }
  return undefined;
}

export interface TestServer {
  url: string;
  apiKey: string;
  dataDir: string;
  /** This server's edge id; every sandbox id is `sb-<edgeId>-…`. */
  edgeId: string;
  dsec: RunningDsec;
  /** Connection options for the SDK: `Sandbox.create({ ...server.conn, … })`. */
  conn: { url: string; apiKey: string };
  /** Kills every sandbox, asserts nothing leaked, removes the data dir. */
  close(): Promise<void>;
}

/**
 * Data dirs this test process made, with where each was made. Full runs have left an empty one
 * behind now and then (no mount, no cgroup, so no leak check saw it): at exit the process names
 * any still on disk and the test line that made it, so the next run says which test it is.
 */
const madeDataDirs = new Map<string, string>();
process.on('exit', () => {
  for (const [dir, madeAt] of madeDataDirs) {
    if (existsSync(dir)) process.stderr.write(`# test data dir left behind: ${dir} (made at ${madeAt})\n`);
  }
});

/**
 * Where /var/tmp is on overlayfs (the suite run in a container, or by fresh-machine): one disk for
 * this test process, the one `dsec doctor` gives such a data dir (host/data-dir-fs.ts
 * fixDataDirFs: a sparse ext4 image beside it, loop-mounted; a tmpfs where no loop device can be
 * had), with every data dir made inside it. Tests that make an edge, a bench or a control plane of
 * their own, without doctor, would otherwise put overlay uppers and EROFS blobs on overlayfs, which
 * takes neither; and a dir inside the mount, not a mount of its own, is what a test's own rmSync of
 * its data dir can remove. Unmounted, and its image removed, when the process exits (a process
 * killed first leaves both under DATA_DIR_PREFIX, where the suite's leak check finds the mount and
 * the loop device). Elsewhere: /var/tmp.
 */
let overlayRootBase: string | null | undefined;
function dataDirParent(): string {
  if (overlayRootBase === undefined) {
    overlayRootBase = null;
    if (filesystemOf('/var/tmp') === 'overlay') {
      const base = mkdtempSync(`${DATA_DIR_PREFIX}root-`);
      fixDataDirFs(base);
      overlayRootBase = base;
      process.on('exit', () => {
        try {
          // Lazily: a child tool still in it lets go when it ends, and the loop device (autoclear)
          // with it; the unlinked image's blocks are freed then.
          umount(base, MNT_DETACH);
          rmdirSync(base);
          rmSync(dataDirImagePath(base), { force: true });
        } catch (err) {
          process.stderr.write(`# could not remove the overlay-root data dir mount ${base}: ${(err as Error).message}\n`);
        }
      });
    }
  }
  return overlayRootBase ?? dirname(DATA_DIR_PREFIX);
}

/**
 * A scratch dir for a test's own trees, as makeDataDir places data dirs: under /var/tmp, or in this
 * process's disk where /var/tmp is overlayfs, which refuses what such trees need (mknod of an
 * overlay whiteout, 0/0: EPERM). `name` ends up in the dir's name.
 */
export function makeScratchDir(name: string): string {
  return mkdtempSync(join(dataDirParent(), `dsec-${name}-`));
}

/** A fresh data dir: under /var/tmp, or inside this process's disk where /var/tmp is on overlayfs (dataDirParent). */
export function makeDataDir(): string {
  const dir = mkdtempSync(join(dataDirParent(), basename(DATA_DIR_PREFIX)));
  const caller =
    new Error().stack
      ?.split('\n')
      .slice(2)
      .find((l) => !l.includes('/helpers/')) ?? '';
  madeDataDirs.set(dir, caller.trim().replace(/^at /, ''));
  return dir;
}

/**
 * A fresh edge id per test server. Sandbox cgroups live under one host-wide parent (`dsec/`) that
 * every dsec on the machine shares; the edge id in each sandbox id tells ours apart.
 */
export function newEdgeId(): string {
  return `t${randomBytes(5).toString('hex')}`;
}

/** Starts dsec on `dataDir` (which may hold state from an earlier start) and builds busybox. */
/**
 * Test servers' sandboxes run in user namespaces, as the edge's default (option `userns`).
 * DSEC_TEST_USERNS=0 runs them with the opt-out (`--no-userns`: sandboxes are host root), so any
 * test file can be run on that path too: `DSEC_TEST_USERNS=0 node scripts/run-tests.mjs files`
 * (scripts/run-tests.mjs runs a few files that way with the whole suite).
 */
export const TEST_USERNS = process.env['DSEC_TEST_USERNS'] !== '0';

export async function startDsec(
  dataDir: string,
  opts: { edgeId: string; maxSandboxes?: number; layerCacheMiB?: number; userns?: boolean; usernsPool?: number; minFreeDiskMiB?: number },
): Promise<RunningDsec> {
  // compileOptions fills every other option with its default; {} as env keeps DSEC_* out.
  // With DSEC_TEST_STORE=postgres the state goes to a database named after the data dir.
  const store = TEST_STORE_POSTGRES ? await testStoreLocation(join(dataDir, 'state.db')) : undefined;
  const options = compileOptions(
    {
      dataDir,
      store,
      listen: '127.0.0.1:0',
      edgeId: opts.edgeId,
      maxSandboxes: opts.maxSandboxes ?? 4000,
      layerCacheMiB: opts.layerCacheMiB,
      minFreeDiskMiB: opts.minFreeDiskMiB,
      userns: opts.userns ?? TEST_USERNS,
      usernsPool: opts.usernsPool,
      logLevel: 'silent',
    },
    {},
  );
  const dsec = await startAllInOne(options);
  try {
    await buildBusyboxImage(dsec.images);
  } catch (err) {
    await dsec.close({ killAll: true });
    throw err;
  }
  return dsec;
}

/** Mounts at or below `dir`, read fresh from mountinfo. */
export function mountsBelow(dir: string): string[] {
  return readMounts()
    .map((m) => m.mountPoint)
    .filter((mp) => mp === dir || mp.startsWith(`${dir}/`));
}

/**
 * findLeaks(dataDir, {includeLayers: true}), with cgroups narrowed to this edge's sandboxes:
 * findLeaks reports every `dsec/sb-*` cgroup on the host, including those of other dsec servers
 * running on the same machine. Mounts, crun containers and directories are per data dir already.
 */
export async function dataDirLeaks(dataDir: string, edgeId: string): Promise<string[]> {
  const leaks = await findLeaks(dataDir, { includeLayers: true });
  return leaks.filter((l) => !l.startsWith('cgroup ') || l.startsWith(`cgroup dsec/sb-${edgeId}-`));
}

/**
 * Asserts a data dir holds nothing on the host any more (no sandbox or layer mount, cgroup, crun
 * container or sandbox directory), then removes it. Refuses to delete through a mount. The one
 * mount allowed is the one `dsec doctor` puts on a data dir that sits on overlayfs (its ext4
 * image, or a tmpfs): it is unmounted first, and the image removed.
 */
export async function assertCleanAndRemove(dataDir: string, edgeId: string): Promise<void> {
  assert.ok(dataDir.startsWith(DATA_DIR_PREFIX), `refusing to remove ${dataDir}: not a test data dir`);
  const leaks = await dataDirLeaks(dataDir, edgeId);
  const doctorMount = readMounts().some(
    (m) => m.mountPoint === dataDir && (m.fsType === 'tmpfs' || loopBackingFile(m)?.startsWith(dataDirImagePath(dataDir))),
  );
  // The edge's nosuid,nodev bind of node/sandboxes onto itself stays when an edge dies without a
  // killAll shutdown; with nothing mounted below it, it holds nothing of a sandbox.
  const sandboxesBind = join(dataDir, 'node', 'sandboxes');
  const onlyBind = !mountsBelow(dataDir).some((mp) => mp.startsWith(`${sandboxesBind}/`));
  if (onlyBind && mountsBelow(dataDir).includes(sandboxesBind)) umount(sandboxesBind, 2);
  const mounts = mountsBelow(dataDir).filter((mp) => !(doctorMount && mp === dataDir));
  if (mounts.length > 0) {
    // Never rm -rf through a mount: that would delete a layer's or a sandbox's files (or worse).
    throw new Error(`data dir ${dataDir} still has mounts; NOT removing it:\n  ${mounts.join('\n  ')}\nleaks: ${JSON.stringify(leaks)}`);
  }
  assert.deepEqual(leaks, [], `dsec leaked resources of ${dataDir}`);
  if (doctorMount) umount(dataDir);
  if (mountsBelow(dataDir).length > 0) throw new Error(`data dir ${dataDir} is still a mount point; NOT removing it`);
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(dataDirImagePath(dataDir), { force: true });
}

/** Starts one shared server for a test file (call from `before`, close from `after`). */
export async function startTestServer(opts: { maxSandboxes?: number; userns?: boolean; usernsPool?: number } = {}): Promise<TestServer> {
  const dataDir = makeDataDir();
  const edgeId = newEdgeId();
  let dsec: RunningDsec;
  try {
    dsec = await startDsec(dataDir, { ...opts, edgeId });
  } catch (err) {
    if (existsSync(dataDir) && mountsBelow(dataDir).length === 0) rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  let closed = false;
  return {
    url: dsec.url,
    apiKey: dsec.apiKey,
    dataDir,
    edgeId,
    dsec,
    conn: { url: dsec.url, apiKey: dsec.apiKey },
    async close() {
      if (closed) return;
      closed = true;
      await dsec.close({ killAll: true });
      await assertCleanAndRemove(dataDir, edgeId);
    },
  };
}

/**
 * The usual set-up of a test file, as hooks of the enclosing describe: one server and one sandbox
 * made with `spec`, handed to `use` before the tests run; the server (with a leak check) is
 * closed after them.
 * @example let server: TestServer; let sb: Sandbox;
 *   useServerAndSandbox({ resources: { memoryMiB: 128 } }, (s, b) => { server = s; sb = b; });
 */
export function useServerAndSandbox(spec: Omit<CreateOptions, 'url' | 'apiKey'>, use: (server: TestServer, sb: Sandbox) => void): void {
  let server: TestServer | undefined;
  before(async () => {
    server = await startTestServer();
    use(server, await Sandbox.create({ ...server.conn, ...spec }));
  });
  after(async () => {
    await server?.close();
  });
}

/** Path of a sandbox's cgroup in one v1 controller (or the v2 mount), as the host sees it. */
export function sandboxCgroupDir(controller: string, id: string): string {
  return join('/sys/fs/cgroup', controller, 'dsec', id);
}
