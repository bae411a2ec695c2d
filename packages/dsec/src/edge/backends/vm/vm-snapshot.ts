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
import { saveRecord, type LiveVm, type SnapshotRecord } from './vm-record.js';
import { saveVmState } from './vm-state.js';
import { putStateBlob, STATE_DISK, STATE_MEMORY, STATE_RECORD } from './vm-state-blob.js';

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
   * live fork (#saveState); with `portable`, as one blob in the cluster's blob store, for a move
   * to another edge (#savePortable).
   */
  async snapshot(
    id: string,
    opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean; portable?: boolean },
  ): Promise<EdgeSnapshot> {
    if (opts.portable && !opts.memory)
      throw new ApiError(
        'INVALID_REQUEST',
        "portable is a VM state's (memory: true); a snapshot as an image is in the blob store already",
        {
          field: 'portable',
        },
      );
    if (opts.portable) return this.#savePortable(id, opts.signal);
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
    const next = `${v.paths.snapshotDir}.new`;
    rmSync(next, { recursive: true, force: true });
    mkdirSync(next, { mode: 0o700 });
    const staged = new VmPaths(v.paths.dir);
    const t0 = performance.now();
    try {
      const { wasRunning } = await saveStateInto(v, next, { copyDisk: true });
      if (wasRunning) await v.qmp.execute('cont');
      rmSync(staged.snapshotDir, { recursive: true, force: true }); // restores reading the old one keep their open files
      renameSync(next, staged.snapshotDir);
    } catch (err) {
      rmSync(next, { recursive: true, force: true });
      if (err instanceof ApiError) throw err;
      throw new ApiError('INTERNAL', `could not snapshot VM ${id}: ${(err as Error).message}`, { id });
    }
    return { layer: null, ...this.#stateBase(v), frozenMs: performance.now() - t0 };
  }

  /**
   * A VM's state for a move to another edge: saved as for a fork, then packed with its disk into
   * one blob in the cluster's blob store (vm-state-blob.ts), which a create's `restoreState`
   * starts from on any edge. The VM stays stopped (paused) afterwards, so nothing it does after
   * the save is lost: the caller kills it once the move is done, or resumes it. A save that fails
   * leaves the VM as it was (running again if it ran) and nothing in the blob store.
   */
  async #savePortable(id: string, signal: AbortSignal | undefined): Promise<EdgeSnapshot> {
    const v = this.#ctx.vm(id);
    if (v.agent.closed) throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} is gone: ${v.agent.closed.message}`);
    // A snapshot as an image has the guest's disk frozen and its reader running: the state waits for it.
    while (v.diffing) await v.diffing.catch(() => undefined);
    const tmpDir = join(this.#ctx.nodeDir, 'tmp');
    mkdirSync(tmpDir, { recursive: true });
    const stage = mkdtempSync(join(tmpDir, 'vm-state-'));
    const t0 = performance.now();
    const wasPaused = v.record.paused === true;
    // Calls that come meanwhile are answered as for a paused VM rather than wait on stopped vCPUs.
    v.record.paused = true;
    const work = (async () => {
      await saveStateInto(v, stage, { copyDisk: false });
      signal?.throwIfAborted();
      saveRecord(v.paths, v.record);
      return putStateBlob(stage, v.paths.disk, { tmpDir, blobs: this.#ctx.blobs, signal });
    })();
    v.diffing = work;
    try {
      const state = await work;
      return { layer: null, ...this.#stateBase(v), frozenMs: performance.now() - t0, state };
    } catch (err) {
      if (!wasPaused && !v.stop.signal.aborted) {
        await v.qmp.execute('cont').catch(() => undefined);
        v.record.paused = false;
        saveRecord(v.paths, v.record);
      }
      if (v.stop.signal.aborted) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
      if (signal?.aborted) throw signal.reason;
      if (err instanceof ApiError) throw err;
      throw new ApiError('INTERNAL', `could not save the state of VM ${id}: ${(err as Error).message}`, { id });
    } finally {
      if (v.diffing === work) v.diffing = undefined;
      await removeTree(stage);
    }
  }

  #stateBase(v: LiveVm): Omit<EdgeSnapshot, 'layer' | 'frozenMs'> {
    return {
      baseLayers: v.record.layers,
      config: v.record.config,
      stats: { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 },
    };
  }
}

/**
 * Stops the VM's vCPUs (unless they are stopped already) and saves into `dir` its memory and
 * device state (`state.bin`, QEMU's migration stream), its record (`record.json`) and, with
 * `copyDisk`, a sparse copy of its disk (`upper.img`). The vCPUs stay stopped when this returns
 * (`wasRunning` says whether to run them again); a save that fails runs them again itself.
 */
async function saveStateInto(v: LiveVm, dir: string, opts: { copyDisk: boolean }): Promise<{ wasRunning: boolean }> {
  const { status } = (await v.qmp.execute('query-status')) as { status?: string };
  const wasRunning = status === 'running';
  if (wasRunning) await v.qmp.execute('stop');
  if (status === 'postmigrate') {
    // QEMU migrates no VM a migration stopped (a save retried, its answer lost, or one after a
    // portable save): the guest runs for a moment, then it is stopped and saved as it is then.
    await v.qmp.execute('cont');
    await v.qmp.execute('stop');
  }
  try {
    if (opts.copyDisk) await copySparse(v.paths.disk, join(dir, STATE_DISK));
    await saveVmState(v.qmp, v.paths.migrationSocket, join(dir, STATE_MEMORY));
    const { backend, layers, config, env, limits, agentKey, memoryBackend } = v.record;
    writeFileAtomic(
      join(dir, STATE_RECORD),
      JSON.stringify({ backend, layers, config, env, limits, agentKey, memoryBackend } satisfies SnapshotRecord),
      0o600,
    );
  } catch (err) {
    if (wasRunning) await v.qmp.execute('cont').catch(() => undefined);
    throw err;
  }
  return { wasRunning };
}
