/** Builds small special-purpose images for tests, through the same builder code path as busybox. */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import type { ImageConfig } from '@dsec/sdk/schema';
import { buildSingleLayerImage, type BuiltImage } from '../../src/image/builders/builder.js';
import { defaultImageConfig, type ImageStore } from '../../src/image/image-store.js';

/**
 * An image of one layer filled by `fill(rootDir)`. Every build gets a unique cache key and a
 * marker file, so its layer is its own (deleting the blob never breaks another image).
 */
export async function buildTestImage(
  store: ImageStore,
  name: string,
  fill: (root: string) => void | Promise<void>,
  config: Partial<ImageConfig> = {},
): Promise<BuiltImage> {
  const unique = randomBytes(8).toString('hex');
  return buildSingleLayerImage({
    store,
    name,
    cacheKey: createHash('sha256').update(`test-${unique}`).digest('hex'), // a build cache key is 64 hex
    progress: () => {},
    erofs: { compression: 'none' },
    config: defaultImageConfig(config),
    fill: async (root) => {
      mkdirSync(root, { recursive: true });
      await fill(root);
      mkdirSync(`${root}/.dsec-test-${unique}`);
    },
  });
}
