import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { ApiError } from '../../api-error.js';
import { buildErofs } from '../../image/erofs.js';
import type { LayerDigest } from '../../image/layer-store.js';
import type { BlobSource } from './blob-source.js';

/** How long a snapshot's copy of the sandbox's changes may run (a container frozen, a guest's disk frozen). */
export const SNAPSHOT_COPY_TIMEOUT_MS = 10 * 60_000;
/** How long mkfs.erofs may take over a snapshot's layer. */
export const SNAPSHOT_PACK_TIMEOUT_MS = 10 * 60_000;

/**
 * The last step of pack_diff, for containers and VMs alike: mkfs.erofs over the staged layer tree,
 * then the blob to the blob source. mkfs.erofs reads every byte the copy staged, so it is bounded
 * in time as the copy is and stopped with it (`stop`: the sandbox killed or the caller gone).
 */
export async function packSnapshotLayer(
  id: string,
  stage: string,
  opts: { tmpDir: string; blobs: BlobSource; sparse: boolean; killed: AbortSignal; cancelled?: AbortSignal | undefined },
): Promise<LayerDigest> {
  const blob = join(opts.tmpDir, `layer-${randomBytes(6).toString('hex')}.erofs`);
  const packing = AbortSignal.any([
    opts.killed,
    ...(opts.cancelled ? [opts.cancelled] : []),
    AbortSignal.timeout(SNAPSHOT_PACK_TIMEOUT_MS),
  ]);
  try {
    await buildErofs(stage, blob, { compression: 'none', chunked: opts.sparse, signal: packing });
  } catch (err) {
    rmSync(blob, { force: true });
    if (!packing.aborted) throw err;
    if (opts.killed.aborted) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
    if (opts.cancelled?.aborted) throw opts.cancelled.reason;
    throw new ApiError(
      'PAYLOAD_TOO_LARGE',
      `packing the snapshot's layer took longer than ${SNAPSHOT_PACK_TIMEOUT_MS / 60_000} minutes; the sandbox changed too much to snapshot`,
      {
        limit: 'packTimeMs',
        max: SNAPSHOT_PACK_TIMEOUT_MS,
      },
    );
  }
  return opts.blobs.put(blob);
}
