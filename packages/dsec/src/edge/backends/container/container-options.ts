import type { Logger } from 'pino';
import type { NodeLinks } from '../../../net/node-links.js';
import type { BlobSource } from '../../node/blob-source.js';
import type { MemoryAdmission } from '../../node/memory-admission.js';
import type { NodeLayers } from '../../node/node-layers.js';
import type { NodeVolumes } from '../../node/node-volumes.js';

/** The container backend's options: the node's own (edge/edge.ts EdgeOptions adds its layers') and the node's shared parts. */
export interface ContainerOptions {
  id: string;
  /** Node-local directory: layer mounts, sandbox dirs, crun state. */
  nodeDir: string;
  /** Where layer blobs come from and snapshot layers go: the local store or the control plane. */
  blobs: BlobSource;
  maxSandboxes: number;
  /** A create is refused (NODE_DISK_FULL) while nodeDir's filesystem has less than this free (bytes); 0 or unset: never. */
  minFreeDiskBytes?: number;
  /** A create is refused (NODE_MEMORY_PRESSURE) while the node's memory is short or thrashing; unset: never. */
  memoryAdmission?: MemoryAdmission;
  /** A sandbox the edge had to end on its own (its lazy layers' daemon died), with why. */
  onSandboxFailed?: (id: string, reason: string) => void;
  /**
   * Run each container sandbox in a user namespace of its own (DSEC_USERNS): its root is a host
   * uid range of its own (host/uid-ranges.ts), not host root; layers and volumes are mounted
   * id-mapped (idmapped-root.ts). Default on; `false` opts out (DSEC_USERNS=false).
   */
  userns?: boolean;
  /**
   * User namespaces kept made ahead for creates (userns-pool.ts; DSEC_USERNS_POOL), each with
   * its uid range claimed; default DEFAULT_USERNS_POOL, 0: none. None without `userns`.
   */
  usernsPool?: number;
  log: Logger;
  /** The node's layer cache, lazy layer store and layer mounts. */
  layers: NodeLayers;
  /** The node's sandbox links (address pool, host guard, dsec-nft), shared with the VM backend. */
  links: NodeLinks;
  /** The node's named volumes. */
  volumes: NodeVolumes;
}
