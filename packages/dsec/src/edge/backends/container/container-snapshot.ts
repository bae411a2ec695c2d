import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ApiError } from '../../../api-error.js';
import { freeze, thaw } from '../../../host/freezer.js';
import { removeTree } from '../../../host/remove-tree.js';
import { syncfs } from '../../../host/syscalls.js';
import { DEFAULT_DIFF_LIMITS, DEFAULT_SCRUB, DiffLimitError, type DiffStats } from '../../../image/pack-diff.js';
import { DiffCancelledError, stageUpperDiffOffThread } from '../../../image/stage-worker.js';
import type { BlobSource } from '../../node/blob-source.js';
import { packSnapshotLayer, SNAPSHOT_COPY_TIMEOUT_MS } from '../../node/snapshot-layer.js';
import type { EdgeSnapshot } from '../../protocol/edge-api.js';
import type { LiveSandbox } from './live-sandbox.js';
import type { SandboxPaths } from './sandbox-record.js';

/**
 * pack_diff: freeze, sync, copy the upper dir to a staging tree (overlay-internal xattrs
 * stripped, scrub paths left out), thaw, then build an EROFS layer from the staging tree. The
 * sandbox is frozen only for the copy. Returns no layer when the sandbox changed nothing.
 */
export async function snapshotContainer(
  l: LiveSandbox,
  opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean },
  node: { paths: SandboxPaths; tmpDir: string; blobs: BlobSource },
): Promise<EdgeSnapshot> {
  const id = l.record.id;
  if (opts.memory)
    throw new ApiError(
      'BACKEND_UNSUPPORTED',
      `sandbox ${id} is a container: its snapshot is an image (memory state is saved for VMs only)`,
      { id },
    );
  // Stopped when the sandbox is killed or the caller goes away: nobody would get the layer.
  const stop = opts.signal ? AbortSignal.any([l.stop.signal, opts.signal]) : l.stop.signal;
  const paths = node.paths;
  const stage = mkdtempSync(join(node.tmpDir, 'snap-'));
  try {
    const wasPaused = l.record.paused === true;
    const t0 = performance.now();
    let stats: DiffStats;
    try {
      if (!wasPaused) {
        // Marked first, as a move's freeze is: an edge that dies while the sandbox is frozen for
        // this copy thaws it when it adopts it at its restart (container-adoption.ts). Unmarked,
        // the freezer said "paused" and the sandbox was adopted so, while its control plane had
        // it running: every exec then hung until its timeout (found by crash-points.test.ts).
        writeFileSync(paths.held, '');
        await freeze(id);
      }
      const fd = openSync(paths.upper, 'r');
      try {
        syncfs(fd);
      } finally {
        closeSync(fd);
      }
      // Off the event loop, bounded, and stopped if the sandbox is killed meanwhile.
      // A user-namespaced sandbox's files are its range's host ids: the layer gets its own ids.
      stats = await stageUpperDiffOffThread(paths.upper, stage, opts.scrub ?? DEFAULT_SCRUB, DEFAULT_DIFF_LIMITS, {
        timeoutMs: SNAPSHOT_COPY_TIMEOUT_MS,
        signal: stop,
        ids: l.record.userns,
      });
    } catch (err) {
      if (err instanceof DiffLimitError) throw new ApiError('PAYLOAD_TOO_LARGE', err.message, err.details);
      if (err instanceof DiffCancelledError && opts.signal?.aborted && !l.stop.signal.aborted) throw opts.signal.reason;
      if (err instanceof DiffCancelledError)
        throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
      throw err;
    } finally {
      if (!wasPaused) await endHold(l, paths.held);
    }
    const frozenMs = performance.now() - t0;
    if (stats.entries === 0) return { layer: null, stats, frozenMs, baseLayers: l.record.layers, config: l.record.config };
    const layer = await packSnapshotLayer(id, stage, {
      tmpDir: node.tmpDir,
      blobs: node.blobs,
      sparse: stats.sparseFiles > 0,
      killed: l.stop.signal,
      cancelled: opts.signal,
    });
    return { layer, stats, frozenMs, baseLayers: l.record.layers, config: l.record.config };
  } finally {
    await removeTree(stage);
  }
}

/**
 * The end of a snapshot's freeze (also when the freeze itself failed): thawed and unmarked,
 * unless another hold began meanwhile. A move that quiesced the sandbox during the copy owns the
 * freeze and the marker now (container-quiesce.ts); a pause its user asked for meanwhile keeps it
 * frozen, and unmarked, since a pause is not thawed at a restart.
 */
async function endHold(l: LiveSandbox, marker: string): Promise<void> {
  if (l.quiesced) return;
  try {
    if (l.record.paused !== true) await thaw(l.record.id);
  } finally {
    rmSync(marker, { force: true });
  }
}
