import { chmodSync, chownSync, mkdirSync, writeFileSync } from 'node:fs';
import { ApiError } from '../../../api-error.js';
import { FREE_SPACE_HINT, isDiskFull } from '../../../host/disk-space.js';
import { ToolError } from '../../../host/run-tool.js';
import type { UidRangePool } from '../../../host/uid-ranges.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { NetworkPolicy } from '../../../net/policy.js';
import type { LayerMounts } from '../../node/layer-mounts.js';
import { tryUnmount } from '../../node/layer-mounts.js';
import type { NodeVolumes } from '../../node/node-volumes.js';
import type { EdgeCreateRequest, EdgeSandbox } from '../../protocol/edge-api.js';
import type { Crun } from './crun.js';
import { makeUserns, mountIdmappedRoot } from './idmapped-root.js';
import { toEdgeSandbox } from './live-sandbox.js';
import { existingDirs, type MountStubs } from './mount-stubs.js';
import { buildOciConfig, MASKED_PATHS } from './oci-config.js';
import { mountOverlay } from './overlay.js';
import type { SandboxRecord, SandboxRecords } from './sandbox-record.js';
import { mountUpperDisk } from './upper-disk.js';
import type { PooledUserns, UsernsPool } from './userns-pool.js';

/** What the create proper uses of the container backend. */
export interface CreateContext {
  edgeId: string;
  /** Whether the sandbox runs in a user namespace of its own. */
  userns: boolean;
  uidRanges: UidRangePool;
  records: SandboxRecords;
  layerMounts: LayerMounts;
  usernsPool: UsernsPool;
  crun: Crun;
  volumes: NodeVolumes;
  /** What every create's OCI config shares, read at start (or at the first create). */
  runtimeInputs(): { cgroupHierarchies: string[]; stubs: MountStubs; seccompBpf: string | undefined };
  applyNetwork(record: SandboxRecord, policy: NetworkPolicy): Promise<void>;
  /** Removes everything of the half-made sandbox, the layers it acquired released. */
  teardown(id: string, layers: LayerDigest[]): Promise<void>;
  /** The sandbox runs: the backend holds it from now on. */
  register(record: SandboxRecord): void;
}

/** The create proper; `pooled`: the namespace taken from the pool, its range already this sandbox's. */
export async function createContainer(
  c: CreateContext,
  req: EdgeCreateRequest,
  network: NetworkPolicy | undefined,
  record: SandboxRecord,
  pooled: PooledUserns | undefined,
): Promise<EdgeSandbox> {
  if (c.userns) {
    try {
      record.userns = pooled?.range ?? c.uidRanges.take(req.id);
    } catch (err) {
      throw new ApiError('CAPACITY_EXCEEDED', (err as Error).message);
    }
  }
  const paths = c.records.paths(req.id, record);
  try {
    mkdirSync(paths.dir, { mode: 0o700 });
    // crun sets up the root from inside the user namespace, as the range's root: it must be
    // able to pass through the bundle dir (group: the range's base gid, search only).
    if (record.userns) {
      chownSync(paths.dir, 0, record.userns.base);
      chmodSync(paths.dir, 0o710);
    }
  } catch (err) {
    c.uidRanges.release(req.id);
    throw err;
  }
  mkdirSync(paths.scratch);
  // The record names the range before anything of the sandbox a crash could leave half-made.
  c.records.save(record);
  const acquired: LayerDigest[] = [];
  try {
    const lowers: string[] = [];
    for (const layer of record.layers) {
      lowers.push(await c.layerMounts.acquire(layer));
      acquired.push(layer);
    }
    if (req.limits.diskMiB !== undefined) await mountUpperDisk(paths.dir, req.limits.diskMiB);
    const range = record.userns;
    const volumes = req.volumes ?? [];
    if (range) {
      if (pooled) c.usernsPool.bindTo(pooled, paths.userns);
      else await makeUserns(range, paths.userns, c.crun.spawner);
      mountIdmappedRoot({
        lowersBottomFirst: lowers,
        upper: paths.upper,
        work: paths.work,
        target: paths.rootfs,
        range,
        usernsFile: paths.userns,
        volumes: volumes.map((v, i) => ({ source: c.volumes.dataDir(v.name), dest: paths.volume(i) })),
      });
    } else {
      mountOverlay(lowers, paths.upper, paths.work, paths.rootfs);
    }
    // In a user namespace crun binds each volume from its id-mapped mount in the sandbox dir.
    const binds = volumes.map((v, i) => ({
      source: range ? paths.volume(i) : c.volumes.dataDir(v.name),
      path: v.path,
      readOnly: v.readOnly,
    }));
    const userns = range ? { userns: { path: paths.userns, base: range.base, size: range.size } } : {};
    const { cgroupHierarchies, stubs: sharedStubs, seccompBpf } = c.runtimeInputs();
    const stubs = { ...sharedStubs, maskedDirs: existingDirs(MASKED_PATHS) };
    writeFileSync(
      paths.config,
      JSON.stringify(
        buildOciConfig({
          id: req.id,
          config: req.config,
          env: req.env,
          limits: req.limits,
          binds,
          seccompBpf: seccompBpf,
          cgroupHierarchies,
          stubs,
          ...userns,
        }),
      ),
    );
    if (seccompBpf) writeFileSync(paths.seccompBpf, Buffer.from(seccompBpf, 'base64'), { mode: 0o600 });
    record.pid = await c.crun.run(
      req.id,
      paths.dir,
      paths.crunLog,
      paths.pidFile,
      binds.map((b) => b.source),
    );
    if (range) tryUnmount(paths.userns); // the container's processes hold the namespace now
    if (network) await c.applyNetwork(record, network);
    record.phase = 'running';
    c.records.save(record);
    c.register(record);
    return toEdgeSandbox(record);
  } catch (err) {
    await c.teardown(req.id, acquired);
    if (err instanceof ToolError) {
      throw new ApiError('SANDBOX_CREATE_FAILED', `crun could not start the sandbox: ${err.result.stderr.trim()}`, {
        tool: 'crun',
        stderr: err.result.stderr,
      });
    }
    if (isDiskFull(err))
      throw new ApiError(
        'NODE_DISK_FULL',
        `could not create the sandbox, the node's disk is full: ${(err as Error).message}; ${FREE_SPACE_HINT}`,
        { edge: c.edgeId },
      );
    if (err instanceof ApiError) throw err;
    throw new ApiError('SANDBOX_CREATE_FAILED', `could not create the sandbox: ${(err as Error).message}`);
  }
}
