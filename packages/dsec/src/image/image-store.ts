import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig, ImageInfo } from '@dsec/sdk/schema';
import { writeFileAtomic } from './atomic-file.js';
import type { LayerDigest, LayerStore } from './layer-store.js';

/** What an image is: ordered layers (bottom first) plus the config processes start with. */
export interface ImageManifest {
  layers: LayerDigest[];
  config: ImageConfig;
  createdAt: string;
}

export type ImageId = `sha256:${string}`;

const NAME = /^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9][a-z0-9._-]{0,62})?$/;

export function isImageName(s: string): boolean {
  return NAME.test(s);
}

/** `busybox` means `busybox:latest`. */
export function normalizeName(name: string): string {
  return name.includes(':') ? name : `${name}:latest`;
}

export function defaultImageConfig(overrides: Partial<ImageConfig> = {}): ImageConfig {
  return {
    env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root'],
    cwd: '/',
    user: '0:0',
    entrypoint: [],
    cmd: ['/bin/sh'],
    labels: {},
    ...overrides,
  };
}

/**
 * Images as files beside the layer store: `images/<hex>.json` holds a manifest, whose id is the
 * sha256 of its canonical JSON, and `images/refs/<name>` names one. Every write is an atomic
 * rename, so the CLI building an image and a running server never see half an image.
 */
export class ImageStore {
  readonly dir: string;
  readonly refsDir: string;
  /** `builds/<cache key>` → the image id a builder made from those inputs (see recordBuild). */
  readonly buildsDir: string;

  constructor(
    root: string,
    readonly layers: LayerStore,
  ) {
    this.dir = join(root, 'images');
    this.refsDir = join(this.dir, 'refs');
    this.buildsDir = join(this.dir, 'builds');
    mkdirSync(this.refsDir, { recursive: true });
    mkdirSync(this.buildsDir, { recursive: true });
  }

  /** The id `put` gives this manifest (the sha256 of its canonical JSON), without storing it. */
  idOf(manifest: Omit<ImageManifest, 'createdAt'>): ImageId {
    return `sha256:${createHash('sha256').update(JSON.stringify({ layers: manifest.layers, config: manifest.config })).digest('hex')}`;
  }

  /** Stores a manifest (idempotent) and returns its id. */
  put(manifest: Omit<ImageManifest, 'createdAt'>): ImageId {
    for (const layer of manifest.layers) {
      if (!this.layers.has(layer)) throw new Error(`image refers to a layer not in the store: ${layer}`);
    }
    const body = { layers: manifest.layers, config: manifest.config };
    const hex = this.idOf(body).slice('sha256:'.length);
    const file = join(this.dir, `${hex}.json`);
    if (!existsSync(file)) writeFileAtomic(file, JSON.stringify({ ...body, createdAt: new Date().toISOString() }, null, 2));
    return `sha256:${hex}`;
  }

  tag(name: string, id: ImageId): void {
    if (!isImageName(name)) throw new Error(`invalid image name ${JSON.stringify(name)}`);
    writeFileAtomic(join(this.refsDir, normalizeName(name)), id);
  }

  /** Resolves a name or id to an image id, or undefined. */
  resolve(ref: string): ImageId | undefined {
    if (/^sha256:[0-9a-f]{64}$/.test(ref)) return existsSync(this.#file(ref as ImageId)) ? (ref as ImageId) : undefined;
    if (!isImageName(ref)) return undefined;
    try {
      const id = readFileSync(join(this.refsDir, normalizeName(ref)), 'utf8').trim() as ImageId;
      return existsSync(this.#file(id)) ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /** The manifest, or undefined when there is none; a manifest that cannot be read throws, naming the file. */
  get(id: ImageId): ImageManifest | undefined {
    const file = this.#file(id);
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR') return undefined;
      throw new CorruptManifestError(id, file, (err as Error).message);
    }
    try {
      return JSON.parse(text) as ImageManifest;
    } catch (err) {
      throw new CorruptManifestError(id, file, (err as Error).message);
    }
  }

  info(id: ImageId): ImageInfo | undefined {
    const m = this.get(id);
    if (!m) return undefined;
    const names = this.#refs()
      .filter(([, target]) => target === id)
      .map(([name]) => name);
    let sizeBytes = 0;
    for (const l of m.layers) sizeBytes += this.layers.has(l) ? this.layers.size(l) : 0;
    return { id, names, layers: m.layers, config: m.config, sizeBytes, createdAt: m.createdAt };
  }

  list(): ImageInfo[] {
    return readdirSync(this.dir)
      .filter((f) => /^[0-9a-f]{64}\.json$/.test(f))
      .map((f) => this.info(`sha256:${f.slice(0, 64)}`))
      .filter((i): i is ImageInfo => i !== undefined)
      .sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  untag(name: string): void {
    rmSync(join(this.refsDir, normalizeName(name)), { force: true });
  }

  /** Deletes a manifest and every name pointing at it (its layers stay until GC). */
  remove(id: ImageId): void {
    for (const [name, target] of this.#refs()) if (target === id) this.untag(name);
    rmSync(this.#file(id), { force: true });
  }

  /**
   * Remembers that a builder made image `id` from inputs hashing to `cacheKey`. A build trusts a
   * name only when it still points at the image recorded here: a name that a snapshot, an import
   * or `dsec image rm` re-pointed is not the builder's output, whatever labels its config carries.
   */
  recordBuild(cacheKey: string, id: ImageId): void {
    if (!/^[0-9a-f]{64}$/.test(cacheKey)) throw new Error(`invalid build cache key ${JSON.stringify(cacheKey)}`);
    writeFileAtomic(join(this.buildsDir, cacheKey), id);
  }

  /** The image a builder last made from `cacheKey`, if it still exists. */
  builtFrom(cacheKey: string): ImageId | undefined {
    if (!/^[0-9a-f]{64}$/.test(cacheKey)) return undefined;
    try {
      const id = readFileSync(join(this.buildsDir, cacheKey), 'utf8').trim() as ImageId;
      return existsSync(this.#file(id)) ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /** Every layer any stored image refers to. */
  referencedLayers(): Set<LayerDigest> {
    const out = new Set<LayerDigest>();
    for (const img of this.list()) for (const l of img.layers) out.add(l as LayerDigest);
    return out;
  }

  #file(id: ImageId): string {
    return join(this.dir, `${id.slice('sha256:'.length)}.json`);
  }

  #refs(): [string, string][] {
    return readdirSync(this.refsDir)
      .filter((f) => !f.includes('.tmp-'))
      .map((f) => [f, readFileSync(join(this.refsDir, f), 'utf8').trim()]);
  }
}

/** A manifest file that exists but cannot be read or parsed: not the same as an image that is absent. */
export class CorruptManifestError extends Error {
  override readonly name = 'CorruptManifestError';
  constructor(
    readonly imageId: string,
    readonly file: string,
    why: string,
  ) {
    super(`the manifest of image ${imageId} (${file}) is corrupt: ${why}; remove the image (dsec images rm) and build or import it again`);
  }
}
