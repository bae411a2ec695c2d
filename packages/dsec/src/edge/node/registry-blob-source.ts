import type { Readable } from 'node:stream';
import { ApiError } from '../../api-error.js';
import type { LayerDigest } from '../../image/layer-store.js';
import { RegistryAuthError, RegistryError, type RegistryClient } from '../../image/registry/registry-client.js';
import type { BlobSource } from './blob-source.js';

/**
 * Layers straight from an OCI registry (`dsec edge --registry HOST/REPOSITORY`): the node reads a
 * blob from the registry's repository, so the control plane carries no layer bytes for images
 * pushed there; a blob the repository lacks (an image built or snapshotted in this cluster and
 * never pushed) comes from `fallback`, the control plane's blob endpoint. New layers (snapshots)
 * go to the fallback, whose store the control plane's image records refer to. A registry that
 * cannot be reached (after the client's retries) is also read around through the fallback.
 */
export class RegistryBlobSource implements BlobSource {
  constructor(
    readonly registry: RegistryClient,
    readonly fallback: BlobSource,
    readonly onFallback?: (digest: LayerDigest, why: string) => void,
  ) {}

  localPath(digest: LayerDigest): string | undefined {
    return this.fallback.localPath(digest);
  }

  has(digest: LayerDigest): boolean | undefined {
    return this.fallback.has(digest) === true ? true : undefined;
  }

  async open(digest: LayerDigest): Promise<Readable> {
    try {
      const found = await this.registry.headBlob(digest);
      if (found) return (await this.registry.getBlob(digest)).body;
    } catch (err) {
      if (!(err instanceof RegistryError)) throw err;
      // Wrong credentials or a refused repository is a configuration to fix: say so, loudly.
      if (err instanceof RegistryAuthError || (err.status !== undefined && err.status < 500)) {
        throw new ApiError('EDGE_UNAVAILABLE', `layer ${digest}: ${err.message}`, {
          layer: digest,
          ...(err.status !== undefined ? { status: err.status } : {}),
        });
      }
      // The registry is down or failing (after the client's retries): the control plane has every
      // layer its images use, so a registry outage costs bandwidth, not sandboxes.
      this.onFallback?.(digest, err.message);
    }
    return this.fallback.open(digest);
  }

  put(file: string): Promise<LayerDigest> {
    return this.fallback.put(file);
  }
}
