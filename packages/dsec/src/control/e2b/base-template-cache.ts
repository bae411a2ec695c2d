/**
 * E2B's `base` template built once per machine and kept: debootstrap takes a minute or more and
 * needs the Debian mirror, so the built layer and its config are kept in a cache directory on the
 * host and imported into each fresh data dir (the test suite's servers, `dsec bench rollout`'s)
 * with its build record. The builder then checks its own cache key against that record: a changed
 * builder rebuilds (and refreshes the cache), an unchanged one does nothing.
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import { CACHE_KEY_LABEL, type Progress } from '../../image/builders/builder.js';
import type { ImageStore } from '../../image/image-store.js';
import type { LayerDigest } from '../../image/layer-store.js';
import { BASE_TEMPLATE, buildE2bBaseImage } from './base-template.js';

/** Where the built template is kept between data dirs: beside them, outside any one of them. */
export const BASE_CACHE_DIR = '/var/tmp/dsec-e2b-base-cache';

interface Cached {
  layers: LayerDigest[];
  config: ImageConfig;
}

/** Puts `base` into `images`: from the host's cache when it holds a build, else built (and cached). */
export async function ensureE2bBaseImage(
  images: ImageStore,
  opts: { progress?: Progress; cacheDir?: string } = {},
): Promise<{ id: string; cached: boolean }> {
  const progress = opts.progress ?? (() => {});
  const dir = opts.cacheDir ?? BASE_CACHE_DIR;
  const meta = join(dir, 'image.json');
  if (existsSync(meta)) {
    const c = JSON.parse(readFileSync(meta, 'utf8')) as Cached;
    if (c.layers.every((l) => existsSync(join(dir, `${l}.erofs`)))) {
      for (const l of c.layers) {
        const tmp = images.layers.tempPath();
        copyFileSync(join(dir, `${l}.erofs`), tmp);
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
    mkdirSync(dir, { recursive: true });
    // Each file is written under a name of this process's and renamed: a reader (another process
    // importing at the same time) sees a whole layer or none, never one half copied.
    for (const l of m.layers) {
      const tmp = join(dir, `${l}.erofs.${process.pid}.tmp`);
      copyFileSync(images.layers.path(l), tmp);
      renameSync(tmp, join(dir, `${l}.erofs`));
    }
    writeFileSync(`${meta}.${process.pid}.tmp`, JSON.stringify({ layers: m.layers, config: m.config } satisfies Cached));
    renameSync(`${meta}.${process.pid}.tmp`, meta);
  }
  return { id: built.id, cached: built.cached };
}
