import type { Readable } from 'node:stream';
import type { LayerDigest } from './layer-digest.js';

/**
 * A blob store: where layer blobs are read from and put. An edge reads its layers through one
 * (the layer store's directory on one machine, the control plane's blob endpoint or the cluster's
 * OCI registry on a node of a cluster: edge/blob-source.ts, edge/registry-blob-source.ts), and a
 * control plane configured with a registry keeps its blobs in one (the registry, with its layer
 * directory as a cache: control/cluster/cluster-registry.ts, attached as LayerStore.remote).
 */
export interface BlobSource {
  /** A file on this node holding the blob (the cache may hard-link or copy it), if there is one. */
  localPath(digest: LayerDigest): string | undefined;
  /** The blob's bytes (the cache hashes them as it writes them). IMAGE_NOT_FOUND when absent. */
  open(digest: LayerDigest): Promise<Readable>;
  /** Whether the source still holds the blob; undefined when it cannot tell cheaply (remote). */
  has(digest: LayerDigest): boolean | undefined;
  /** Stores a finished blob file (consumed) and returns its digest. */
  put(file: string): Promise<LayerDigest>;
  /**
   * Deletes the blob (image GC: callers make sure nothing refers to it); the bytes it freed, 0
   * when it held none. Only stores that own their blobs have it (an edge's sources do not).
   */
  remove?(digest: LayerDigest): Promise<number>;
}
