import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import { buildErofs, type ErofsBuildOptions } from '../erofs.js';
import { isImageName, type ImageId, type ImageStore } from '../image-store.js';
import { stagingPrefix } from '../staging.js';

/**
 * Label holding a builder's cache key, for people reading an image's config. The cache itself is
 * the store's build record (ImageStore.recordBuild), which a label copied into a snapshot or an
 * imported image cannot fake.
 */
export const CACHE_KEY_LABEL = 'dsec.build.key';

/** A build argument that is wrong before any work starts (a bad name, an unknown builder). */
export class BuildInputError extends Error {
  override readonly name = 'BuildInputError';
}

/** Throws BuildInputError unless `name` is a valid image name; call before any build work. */
export function checkImageName(name: string): void {
  if (!isImageName(name)) {
    throw new BuildInputError(
      `invalid image name ${JSON.stringify(name)}: use lower-case letters, digits, '.', '_' and '-' (up to 63), optionally :tag (e.g. py:3.11)`,
    );
  }
}

export type Progress = (message: string) => void;

export interface BuiltImage {
  id: ImageId;
  name: string;
  cached: boolean;
}

/**
 * The part every root-filesystem builder shares: look the name up and reuse it when its cache key
 * matches; otherwise fill a scratch directory, turn it into one EROFS layer and tag the image.
 */
export async function buildSingleLayerImage(opts: {
  store: ImageStore;
  name: string;
  cacheKey: string;
  config: ImageConfig;
  progress: Progress;
  erofs?: ErofsBuildOptions;
  fill: (rootDir: string) => Promise<void>;
}): Promise<BuiltImage> {
  const { store, name, cacheKey, progress } = opts;
  checkImageName(name);
  const existing = store.resolve(name);
  if (existing && existing === store.builtFrom(cacheKey)) {
    progress(`image ${name} is up to date (${existing.slice(0, 19)})`);
    return { id: existing, name, cached: true };
  }
  const scratch = mkdtempSync(join(store.layers.tmpDir, stagingPrefix('build')));
  try {
    const root = join(scratch, 'root');
    await opts.fill(root);
    progress('packing the root filesystem with mkfs.erofs');
    const blob = store.layers.tempPath();
    await buildErofs(root, blob, opts.erofs);
    const layer = await store.layers.add(blob);
    const config = { ...opts.config, labels: { ...opts.config.labels, [CACHE_KEY_LABEL]: cacheKey } };
    const id = store.put({ layers: [layer], config });
    store.recordBuild(cacheKey, id);
    store.tag(name, id);
    progress(`image ${name} built: ${id.slice(0, 19)} (layer ${layer.slice(0, 19)}, ${store.layers.size(layer)} bytes)`);
    return { id, name, cached: false };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** A UUID (v4 layout) derived from a cache key, for reproducible filesystem images. */
export function uuidFromKey(key: string): string {
  const h = key.padEnd(32, '0').slice(0, 32);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`;
}
