import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeFileAtomic } from '../atomic-file.js';
import type { ImageId, ImageStore } from '../image-store.js';

const VERSION = 1;

export interface CacheEntry {
  /** The image the step produced (an unnamed intermediate image, kept like any other). */
  imageId: ImageId;
  instruction: string;
  createdAt: string;
}

/**
 * The Dockerfile build cache: step key → the image that step produced. A key covers the parent
 * image (its layers and config), the instruction text and whatever else the step reads (copied
 * files, build arguments). Stored as JSON at DATA/images/build-cache.json, written atomically;
 * an entry whose image or layers are gone (removed, GC'd) is a miss.
 */
export class BuildCache {
  readonly path: string;
  #entries: Record<string, CacheEntry>;

  constructor(readonly images: ImageStore) {
    this.path = join(images.dir, 'build-cache.json');
    this.#entries = this.#read();
  }

  #read(): Record<string, CacheEntry> {
    try {
      const c = JSON.parse(readFileSync(this.path, 'utf8')) as { version?: number; entries?: Record<string, CacheEntry> };
      if (c.version === VERSION && c.entries && typeof c.entries === 'object') return c.entries;
    } catch {
      // missing or unreadable: an empty cache
    }
    return {};
  }

  static key(parts: unknown[]): string {
    return createHash('sha256')
      .update(JSON.stringify([VERSION, ...parts]))
      .digest('hex');
  }

  /** The cached result of a step, if its image and every layer of it still exist. */
  get(key: string): ImageId | undefined {
    const e = this.#entries[key];
    if (!e) return undefined;
    const m = this.images.get(e.imageId);
    if (!m || !m.layers.every((l) => this.images.layers.has(l))) return undefined;
    return e.imageId;
  }

  /** Records a step's result; re-reads the file first so concurrent builds lose little. */
  set(key: string, imageId: ImageId, instruction: string): void {
    this.#entries = { ...this.#read(), ...this.#entries, [key]: { imageId, instruction, createdAt: new Date().toISOString() } };
    writeFileAtomic(this.path, JSON.stringify({ version: VERSION, entries: this.#entries }, null, 2));
  }
}
