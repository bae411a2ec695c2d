/**
 * E2B's `base` template for the tests, built once per machine: debootstrap takes a minute or more,
 * so the built layer and its config are kept in a cache directory beside the test data dirs and
 * imported into each fresh data dir with its build record. The builder then checks its own cache
 * key against that record: a changed builder rebuilds (and refreshes the cache), an unchanged one
 * does nothing.
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildE2bBaseImage, BASE_TEMPLATE } from '../../src/control/e2b/base-template.js';
import { CACHE_KEY_LABEL } from '../../src/image/builders/builder.js';
import type { ImageStore } from '../../src/image/image-store.js';
import type { LayerDigest } from '../../src/image/layer-store.js';
import type { ImageConfig } from '@dsec/sdk/schema';

export const BASE_CACHE_DIR = '/var/tmp/dsec-e2b-base-cache';

interface Cached {
  layers: LayerDigest[];
  config: ImageConfig;
}

export async function ensureBaseImage(images: ImageStore, progress: (m: string) => void = () => {}): Promise<{ cached: boolean }> {
  const meta = join(BASE_CACHE_DIR, 'image.json');
  if (existsSync(meta)) {
    const c = JSON.parse(readFileSync(meta, 'utf8')) as Cached;
    if (c.layers.every((l) => existsSync(join(BASE_CACHE_DIR, `${l}.erofs`)))) {
      for (const l of c.layers) {
        const tmp = images.layers.tempPath();
        copyFileSync(join(BASE_CACHE_DIR, `${l}.erofs`), tmp);
        await images.layers.add(tmp);
      }
      const id = images.put({ layers: c.layers, config: c.config });
      images.tag(BASE_TEMPLATE, id);
      // The builder trusts a name only with its build record: the cached image is what it built.
      const key = c.config.labels[CACHE_KEY_LABEL];
      if (key) images.recordBuild(key, id);
    }
  }
  const built = await buildE2bBaseImage(images, { progress });
  if (!built.cached) {
    const m = images.get(built.id)!;
    mkdirSync(BASE_CACHE_DIR, { recursive: true });
    // Each file is written under a name of this process's and renamed: a reader (another test file
    // running at the same time) sees a whole layer or none, never one half copied.
    for (const l of m.layers) {
      const tmp = join(BASE_CACHE_DIR, `${l}.erofs.${process.pid}.tmp`);
      copyFileSync(images.layers.path(l), tmp);
      renameSync(tmp, join(BASE_CACHE_DIR, `${l}.erofs`));
    }
    writeFileSync(`${meta}.${process.pid}.tmp`, JSON.stringify({ layers: m.layers, config: m.config } satisfies Cached));
    renameSync(`${meta}.${process.pid}.tmp`, meta);
  }
  return { cached: built.cached };
}
