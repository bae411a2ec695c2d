import type { Readable } from 'node:stream';
import type { LayerDigest } from '../../image/layer-store.js';
import type { BlobSource } from './blob-source.js';

/**
 * The blob source of an edge whose sources are known only once it has joined: the control
 * plane's blob endpoint at first, then (when the join names the cluster's registry) a source that
 * reads that registry first. The node is built before the join (the join reports its facts), and
 * no create reaches it before the join, so nothing is fetched from the first source in practice.
 */
export class JoinedBlobSource implements BlobSource {
  #current: BlobSource;

  constructor(initial: BlobSource) {
    this.#current = initial;
  }

  /** From now on, blobs come from `source`. */
  use(source: BlobSource): void {
    this.#current = source;
  }

  localPath(digest: LayerDigest): string | undefined {
    return this.#current.localPath(digest);
  }

  open(digest: LayerDigest): Promise<Readable> {
    return this.#current.open(digest);
  }

  has(digest: LayerDigest): boolean | undefined {
    return this.#current.has(digest);
  }

  put(file: string): Promise<LayerDigest> {
    return this.#current.put(file);
  }
}
