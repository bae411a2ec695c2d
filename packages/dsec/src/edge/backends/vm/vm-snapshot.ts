import { mkdirSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { ApiError } from '../../../api-error.js';
import { removeTree } from '../../../host/remove-tree.js';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import { UnsafeArchiveError } from '../../../image/oci/safe-extract.js';
import { TarFormatError } from '../../../image/oci/tar-reader.js';
import { DEFAULT_DIFF_LIMITS, DEFAULT_SCRUB, DiffLimitError } from '../../../image/pack-diff.js';
import type { BlobSource } from '../../node/blob-source.js';
import { packSnapshotLayer, SNAPSHOT_COPY_TIMEOUT_MS } from '../../node/snapshot-layer.js';
import type { EdgeSnapshot } from '../../protocol/edge-api.js';
import { AgentError } from './agent-client.js';
import { VmPaths } from './qemu-launch.js';
import { copySparse } from './vm-boot.js';
import type { VmLookup } from './vm-commands.js';
import { GuestDiffError, stageGuestUpper } from './vm-disk-diff.js';
import type { LiveVm, SnapshotRecord } from './vm-record.js';
import { saveVmState } from './vm-state.js';

export interface VmSnapshotContext extends VmLookup {
  nodeDir: string;
  /** Where snapshot layers go (the edge's blob source). */
  blobs: BlobSource;
  log: Logger;
}

/** VM snapshots: as an image (a layer, for containers and VMs alike) or as the VM's state (a live fork). */
export class VmSnapshots {
  readonly #ctx: VmSnapshotContext;

  constructor(ctx: VmSnapshotContext) {
    this.#ctx = ctx;
  }

  /**
   * A VM's snapshot. As an image (the default): pack_diff of the guest's overlay upper, read by
   * the agent with its disk frozen and streamed as a tar (vm-disk-diff.ts), a layer over the VM's
   * own layers that containers and VMs start from. `memory`: its memory and device state, for a
   * live fork (#saveState).
   */
  async snapshot(id: string, opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean }): Promise<EdgeSnapshot> {
    if (opts.memory) return this.#saveState(id);
    const v = this.#ctx.vm(id);
    if (v.record.paused) {
      throw new ApiError(
        'SANDBOX_NOT_RUNNING',
        `VM ${id} is paused: its agent reads its disk for a snapshot as an image; resume it first (a paused VM can be forked as it is)`,
        { id, status: 'paused' },
      );
    }
    this.#ctx.running(id);
    // One reader of the guest's disk at a time: a second snapshot waits for the first.
    while (v.diffing) await v.diffing.catch(() => undefined);
    const work = this.#snapshotImage(v, opts);
    v.diffing = work;
    try {
      return await work;
    } finally {
      if (v.diffing === work) v.diffing = undefined;
    }
  }

  async #snapshotImage(v: LiveVm, opts: { scrub?: string[]; signal?: AbortSignal }): Promise<EdgeSnapshot> {
    const id = v.record.id;
    const tmpDir = join(this.#ctx.nodeDir, 'tmp');
    mkdirSync(tmpDir, { recursive: true });
    const stage = mkdtempSync(join(tmpDir, 'vm-snap-'));
    const copying = AbortSignal.any([v.stop.signal, AbortSignal.timeout(SNAPSHOT_COPY_TIMEOUT_MS), ...(opts.signal ? [opts.signal] : [])]);
    try {
      const t0 = performance.now();
      let stats;
      try {
        stats = await stageGuestUpper(v.agent, stage, {
          scrub: opts.scrub ?? DEFAULT_SCRUB,
          limits: DEFAULT_DIFF_LIMITS,
          signal: copying,
          timeoutMs: SNAPSHOT_COPY_TIMEOUT_MS,
          warn: (message) => this.#ctx.log.warn({ sandbox: id }, message),
        });
      } catch (err) {
        if (err instanceof DiffLimitError) throw new ApiError('PAYLOAD_TOO_LARGE', err.message, err.details);
        if (v.stop.signal.aborted) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (copying.aborted) {
          throw new ApiError(
            'PAYLOAD_TOO_LARGE',
            `reading the VM's disk for its snapshot took longer than ${SNAPSHOT_COPY_TIMEOUT_MS / 60_000} minutes; the sandbox changed too much to snapshot`,
            {
              limit: 'copyTimeMs',
              max: SNAPSHOT_COPY_TIMEOUT_MS,
            },
          );
        }
        if (v.agent.closed)
          throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} went away during its snapshot: ${v.agent.closed.message}`, {
            id,
          });
        // What the guest sent is the guest's: a broken archive is its doing, not the edge's.
        if (
          err instanceof TarFormatError ||
          err instanceof UnsafeArchiveError ||
          err instanceof GuestDiffError ||
          err instanceof AgentError
        ) {
          throw new ApiError('SANDBOX_NOT_RUNNING', `VM ${id}: its disk could not be read for the snapshot: ${err.message}`, { id });
        }
        throw err;
      }
      const frozenMs = performance.now() - t0;
      const base = { baseLayers: v.record.layers, config: v.record.config, stats, frozenMs };
      if (stats.entries === 0) return { layer: null, ...base };
      const layer = await packSnapshotLayer(id, stage, {
        tmpDir,
        blobs: this.#ctx.blobs,
        sparse: false,
        killed: v.stop.signal,
        cancelled: opts.signal,
      });
      return { layer, ...base };
    } finally {
      await removeTree(stage);
    }
  }

  /**
   * A VM's state for a live fork: with its vCPUs stopped, its disk copied (sparse) and its memory
   * and device state saved through QEMU's migration stream (vm-state.ts), then the VM runs on.
   * The state stays on this edge, beside the VM (`snapshot/`), until the VM is killed or saved
   * again; creates with `restoreFrom` start new VMs from it, each with its own copy of the disk.
   */
  async #saveState(id: string): Promise<EdgeSnapshot> {
    const v = this.#ctx.vm(id);
    if (v.agent.closed) throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} is gone: ${v.agent.closed.message}`);
    const wasPaused = v.record.paused === true;
    const next = `${v.paths.snapshotDir}.new`;
    rmSync(next, { recursive: true, force: true });
    mkdirSync(next, { mode: 0o700 });
    const staged = new VmPaths(v.paths.dir);
    const t0 = performance.now();
    try {
      if (!wasPaused) await v.qmp.execute('stop');
      try {
        await copySparse(v.paths.disk, join(next, 'upper.img'));
        await saveVmState(v.qmp, v.paths.migrationSocket, join(next, 'state.bin'));
      } finally {
        if (!wasPaused) await v.qmp.execute('cont');
      }
      const { backend, layers, config, env, limits, agentKey } = v.record;
      writeFileAtomic(
        join(next, 'record.json'),
        JSON.stringify({ backend, layers, config, env, limits, agentKey } satisfies SnapshotRecord),
        0o600,
      );
      rmSync(staged.snapshotDir, { recursive: true, force: true }); // restores reading the old one keep their open files
      renameSync(next, staged.snapshotDir);
    } catch (err) {
      rmSync(next, { recursive: true, force: true });
      if (err instanceof ApiError) throw err;
      throw new ApiError('INTERNAL', `could not snapshot VM ${id}: ${(err as Error).message}`, { id });
    }
    const frozenMs = performance.now() - t0;
    return {
      layer: null,
      baseLayers: v.record.layers,
      config: v.record.config,
      stats: { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 },
      frozenMs,
    };
  }
}
