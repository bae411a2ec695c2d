import type { ImageStore } from '../image-store.js';
import { configBlob, dsecManifest, OCI_MANIFEST_MEDIA_TYPE, sha256Digest } from './dsec-artifact.js';
import { ImageTransferError, type RegistryClient } from './registry-client.js';

export interface PushResult {
  /** The manifest's digest: pull by `REPO@<digest>` to get exactly this image. */
  digest: string;
  /** Layers uploaded (the others the repository had already). */
  uploadedLayers: number;
  layers: number;
  bytes: number;
}

/**
 * Pushes an image of the local store to a registry: every layer blob the repository lacks (HEAD
 * first), the config blob, then the manifest under `tag`. The manifest goes last, so a reader
 * never sees a manifest whose blobs are not all there.
 */
export async function pushImage(
  images: ImageStore,
  image: string,
  client: RegistryClient,
  tag: string,
  progress: (line: string) => void = () => {},
): Promise<PushResult> {
  const id = await images.resolve(image);
  if (!id) throw new ImageTransferError(`no image ${JSON.stringify(image)} in the local image store (dsec image ls lists them)`);
  const manifest = await images.get(id);
  if (!manifest) throw new ImageTransferError(`image ${id} has no manifest`);
  const layers: { digest: string; size: number }[] = [];
  let uploaded = 0;
  let bytes = 0;
  for (const [i, digest] of manifest.layers.entries()) {
    // A replica whose blob store is the cluster's registry may have to fetch the layer first.
    if (!(await images.layers.fetch(digest))) throw new ImageTransferError(`layer ${digest} of image ${id} is not in the layer store`);
    const size = images.layers.size(digest);
    const r = await client.putBlobFile(digest, images.layers.path(digest));
    progress(
      `layer ${i + 1}/${manifest.layers.length} ${digest.slice(7, 19)} ${r.uploaded ? `uploaded (${size} bytes)` : 'already there'}`,
    );
    if (r.uploaded) {
      uploaded++;
      bytes += size;
    }
    layers.push({ digest, size });
  }
  const config = configBlob(manifest.config);
  await client.putBlobBytes(sha256Digest(config), config);
  const body = Buffer.from(JSON.stringify(dsecManifest(config, layers, manifest.createdAt)));
  const digest = sha256Digest(body);
  const given = await client.putManifest(tag, OCI_MANIFEST_MEDIA_TYPE, body);
  if (given !== undefined && given !== digest)
    throw new ImageTransferError(`the registry stored the manifest as ${given}, but its bytes hash to ${digest}`);
  return { digest, uploadedLayers: uploaded, layers: layers.length, bytes };
}
