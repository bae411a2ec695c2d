import { ApiError } from '../../api-error.js';
import { FREE_SPACE_HINT, freeBytes } from '../../host/disk-space.js';
import type { LayerDigest } from '../../image/layer-store.js';
import type { EdgeCreateRequest } from '../protocol/edge-api.js';
import { volumeMountsError } from '../protocol/volume-paths.js';
import type { BlobSource } from './blob-source.js';
import type { LayerCache } from './layer-cache.js';
import { memoryAdmissionError, type MemoryAdmission } from './memory-admission.js';
import type { NodeVolumes } from './node-volumes.js';

/** What the node admits a create against: its state, its sandbox count, disk and memory. */
export interface NodeRoom {
  edgeId: string;
  nodeDir: string;
  state: string;
  /** Sandboxes running and being created or killed. */
  count: number;
  maxSandboxes: number;
  /** A create is refused (NODE_DISK_FULL) while nodeDir's filesystem has less than this free (bytes); 0 or unset: never. */
  minFreeDiskBytes?: number | undefined;
  /** A create is refused (NODE_MEMORY_PRESSURE) while the node's memory is short or thrashing; unset: never. */
  memoryAdmission?: MemoryAdmission | undefined;
}

/** The node's word on a create before anything is made: refused with the reason, or returns. */
export function admit(room: NodeRoom): void {
  if (room.state !== 'running') throw new ApiError('CAPACITY_EXCEEDED', `edge ${room.edgeId} is ${room.state}, not accepting sandboxes`);
  if (room.count >= room.maxSandboxes) {
    throw new ApiError('CAPACITY_EXCEEDED', `edge ${room.edgeId} is full (${room.maxSandboxes} sandboxes)`, {
      maxSandboxes: room.maxSandboxes,
    });
  }
  const minFree = room.minFreeDiskBytes ?? 0;
  if (minFree > 0) {
    const free = freeBytes(room.nodeDir);
    if (free < minFree) {
      throw new ApiError(
        'NODE_DISK_FULL',
        `edge ${room.edgeId}: ${free >> 20} MiB free under ${room.nodeDir}, below the ${minFree >> 20} MiB a create needs (--min-free-disk-mib); ${FREE_SPACE_HINT}`,
        { edge: room.edgeId, freeMiB: free >> 20, minFreeMiB: minFree >> 20, admission: true },
      );
    }
  }
  const memoryRefusal = room.memoryAdmission && memoryAdmissionError(room.edgeId, room.memoryAdmission);
  if (memoryRefusal) throw memoryRefusal;
}

/** The layers and volumes a create names exist on this node (or its blob store), and its mounts are valid. */
export function checkCreateInputs(
  req: EdgeCreateRequest,
  node: { edgeId: string; layerCache: LayerCache; blobs: BlobSource; volumes: NodeVolumes },
): void {
  for (const layer of req.layers as LayerDigest[]) {
    if (!node.layerCache.has(layer) && node.blobs.has(layer) === false) {
      throw new ApiError('IMAGE_NOT_FOUND', `layer ${layer} is not in the layer store`, { layer });
    }
  }
  const volumes = req.volumes ?? [];
  const badMount = volumeMountsError(volumes);
  if (badMount) throw new ApiError('INVALID_REQUEST', badMount, { field: 'volumes' });
  for (const v of volumes)
    if (!node.volumes.has(v.name)) throw new ApiError('VOLUME_NOT_FOUND', `no volume ${v.name} on edge ${node.edgeId}`, { name: v.name });
}
