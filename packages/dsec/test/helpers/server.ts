/**
 * Starts a real all-in-one dsec (control plane + local edge on crun) for integration tests, on a
 * fresh data dir under /var/tmp, and tears it down with a leak check. Nothing here is mocked.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { findLeaks } from '../../src/host/leak-check.js';
import { readMounts } from '../../src/host/mounts.js';
import { which } from '../../src/host/doctor.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startAllInOne, type RunningDsec } from '../../src/runtime/all-in-one.js';

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
  dsec: RunningDsec;
  /** Connection options for the SDK: `Sandbox.create({ ...server.conn, … })`. */
  conn: { url: string; apiKey: string };
  /** Kills every sandbox, asserts nothing leaked, removes the data dir. */
  close(): Promise<void>;
}

export function makeDataDir(): string {
  return mkdtempSync(DATA_DIR_PREFIX);
}

/** Starts dsec on `dataDir` (which may hold state from an earlier start) and builds busybox. */
export async function startDsec(dataDir: string, opts: { maxSandboxes?: number } = {}): Promise<RunningDsec> {
  const dsec = await startAllInOne({
    dataDir,
    listen: '127.0.0.1:0',
    edgeId: 'local',
    maxSandboxes: opts.maxSandboxes ?? 4000,
    logLevel: 'silent',
  });
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
 * Asserts a data dir holds nothing on the host any more (no sandbox or layer mount, cgroup, crun
 * container or sandbox directory), then removes it. Refuses to delete through a mount.
 */
export async function assertCleanAndRemove(dataDir: string): Promise<void> {
  assert.ok(dataDir.startsWith(DATA_DIR_PREFIX), `refusing to remove ${dataDir}: not a test data dir`);
  const leaks = await findLeaks(dataDir, { includeLayers: true });
  const mounts = mountsBelow(dataDir);
  if (mounts.length > 0) {
    // Never rm -rf through a mount: that would delete a layer's or a sandbox's files (or worse).
    throw new Error(`data dir ${dataDir} still has mounts; NOT removing it:\n  ${mounts.join('\n  ')}\nleaks: ${JSON.stringify(leaks)}`);
  }
  assert.deepEqual(leaks, [], `dsec leaked resources of ${dataDir}`);
  rmSync(dataDir, { recursive: true, force: true });
}

/** Starts one shared server for a test file (call from `before`, close from `after`). */
export async function startTestServer(opts: { maxSandboxes?: number } = {}): Promise<TestServer> {
  const dataDir = makeDataDir();
  let dsec: RunningDsec;
  try {
    dsec = await startDsec(dataDir, opts);
  } catch (err) {
    if (existsSync(dataDir) && mountsBelow(dataDir).length === 0) rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  let closed = false;
  return {
    url: dsec.url,
    apiKey: dsec.apiKey,
    dataDir,
    dsec,
    conn: { url: dsec.url, apiKey: dsec.apiKey },
    async close() {
      if (closed) return;
      closed = true;
      await dsec.close({ killAll: true });
      await assertCleanAndRemove(dataDir);
    },
  };
}

/** Path of a sandbox's cgroup in one v1 controller (or the v2 mount), as the host sees it. */
export function sandboxCgroupDir(controller: string, id: string): string {
  return join('/sys/fs/cgroup', controller, 'dsec', id);
}
