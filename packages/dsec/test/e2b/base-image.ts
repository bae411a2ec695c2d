/**
 * E2B's `base` template for the tests, built once per machine and kept in a cache directory beside
 * the test data dirs (control/e2b/base-template-cache.ts, which `dsec bench rollout` uses too).
 */
import { BASE_CACHE_DIR, ensureE2bBaseImage } from '../../src/control/e2b/base-template-cache.js';
import type { ImageStore } from '../../src/image/image-store.js';

export { BASE_CACHE_DIR };

export async function ensureBaseImage(images: ImageStore, progress: (m: string) => void = () => {}): Promise<{ cached: boolean }> {
  const { cached } = await ensureE2bBaseImage(images, { progress });
  return { cached };
}
