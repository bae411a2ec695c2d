import { DSEC_VERSION } from '../../version.js';
import { EDGE_PROTOCOL_VERSION, type EdgeInfo, type SandboxLimits } from '../protocol/schemas.js';
import type { NodeLayers } from './node-layers.js';
import { nodeCapacity } from './node-capacity.js';

/** What the VM backend reports for the node's info (VmBackend.capacity() and its count). */
export interface VmCapacity {
  count: number;
  slots: number;
  running: number;
  memoryCommittedMiB: number;
  overheadMiB: number;
  cpuCommitted: number;
}

export interface NodeInfoParts {
  id: string;
  state: EdgeInfo['state'];
  maxSandboxes: number;
  /** The container sandboxes: whether an id is one, and their limits. */
  containers: { count: number; owns(id: string): boolean; limits(): SandboxLimits[] };
  layers: NodeLayers;
  /** Container sandboxes that are the FnCall backend's workers: the node's own, never listed. */
  workers: number;
  vms?: VmCapacity | undefined;
}

/**
 * The node's info: the container sandboxes' count and capacity, the layer cache, with the VMs
 * counted in (sandboxes, committed CPU and memory, and capacity.vms) and the function-call
 * workers counted out: they are the node's own, never listed, so `sandboxes` counts what the
 * control plane placed here (a drained edge leaves once that is 0; its workers go with it) and
 * the slots the workers hold are not on offer.
 */
export function nodeInfo(p: NodeInfoParts): EdgeInfo {
  const own: EdgeInfo = {
    id: p.id,
    protocol: EDGE_PROTOCOL_VERSION,
    version: DSEC_VERSION,
    state: p.state,
    sandboxes: p.containers.count,
    maxSandboxes: p.maxSandboxes,
    capacity: nodeCapacity(p.containers.limits()),
    layerCache: p.layers.stats((id) => p.containers.owns(id)),
    cachedLayers: p.layers.cache.digests(),
  };
  const info = { ...own, sandboxes: own.sandboxes - p.workers, maxSandboxes: own.maxSandboxes - p.workers };
  if (!p.vms) return info;
  const { cpuCommitted, count, ...vms } = p.vms;
  const c = info.capacity;
  return {
    ...info,
    sandboxes: info.sandboxes + count,
    capacity: {
      ...c,
      cpuCommitted: Math.round((c.cpuCommitted + cpuCommitted) * 1000) / 1000,
      memoryCommittedMiB: c.memoryCommittedMiB + vms.memoryCommittedMiB,
      vms,
    },
  };
}
