import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig, ImageInfo } from '@dsec/sdk/schema';
import { writeFileAtomic } from './atomic-file.js';
import type { LayerDigest, LayerStore } from './layer-store.js';

/** What an image is: ordered layers (bottom first) plus the config processes start with. */
export interface ImageManifest {
  layers: LayerDigest[];
  config: ImageConfig;
  createdAt: string;
  /**
   * Each layer's size in bytes, when the manifest came through a blob store that is not this
   * host's directory (ImagePublisher): a replica that has not fetched a layer still knows its size.
   */
  layerSizes?: number[];
}

export type ImageId = `sha256:${string}`;

/** `value` frozen with everything it holds: a change to any part throws (modules run in strict mode). */
function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object' && !Object.isFrozen(value)) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

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
 * A change to the image records, as a catalog applies it. `imported`: found as a file, so it is
 * applied only when the catalog has no such entry and has not deleted one (a tombstone) since the
 * file was written (`writtenAt`: a file written after the delete, by a build or an import that
 * ran since, is a new image or name, not a stale copy).
 */
export type ImageChange =
  | { op: 'put'; id: ImageId; manifest: ImageManifest; imported?: boolean; writtenAt?: string }
  | { op: 'tag'; name: string; id: ImageId; imported?: boolean; writtenAt?: string }
  | { op: 'untag'; name: string }
  | { op: 'remove'; id: ImageId }
  | { op: 'build'; key: string; id: ImageId; imported?: boolean };

/** Everything a catalog holds, at its version (bumped by every change). */
export interface ImageCatalogSnapshot {
  version: number;
  images: [ImageId, ImageManifest][];
  names: [string, ImageId][];
  builds: [string, ImageId][];
}

/**
 * Where image records live when several processes share them: the control plane's state store
 * (SQLite or PostgreSQL; control/image-catalog.ts), so every replica on one store sees the same
 * images, names and builds.
 */
export interface ImageCatalog {
  version(): Promise<number>;
  load(): Promise<ImageCatalogSnapshot>;
  apply(changes: ImageChange[]): Promise<void>;
}

/**
 * Where an image's blobs go before its record reaches the catalog, when the blob store is not a
 * directory every replica reads: the cluster's registry (control/cluster/cluster-registry.ts).
 * A replica that sees an image in the catalog can then read all of it.
 */
export interface ImagePublisher {
  /** Makes the image's layers (and the image) readable by every replica; the layers' sizes. */
  publish(id: ImageId, manifest: ImageManifest): Promise<number[]>;
  /** The image was deleted: drops what publish stored for the image alone (never throws). */
  withdraw(id: ImageId): Promise<void>;
}

/**
 * Image records: a manifest (ordered layers plus config) whose id is the sha256 of its canonical
 * JSON, names pointing at ids, and which image a builder made from which inputs, as files beside
 * the layer store: `images/<hex>.json`, `images/refs/<name>`, `images/builds/<key>`. Every write
 * is an atomic rename, so the CLI building an image and a running server never see half an image.
 *
 * With a catalog attached (the control plane attaches its state store) the catalog is the truth
 * and the files are this host's copy of it, which the CLI and builders keep reading and writing:
 * every write also goes to the catalog, in order (flush() waits for them; the server flushes
 * before it answers), and refresh() imports files the catalog has not seen (from before the
 * catalog, or written by a tool) and then brings the files in line with the catalog: images,
 * names and builds made at another replica are written here, and those deleted there go here.
 *
 * One file for one concept, the image records of this host: the files, the catalog sync and the
 * reads kept in memory (#recent, the frozen manifests) share one state, since every write must
 * empty what is kept and mark what is synced; the catalog's and the publisher's contracts above
 * are what other modules implement.
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
    // Root's alone: image names and configs of private images are their projects'.
    chmodSync(this.dir, 0o700);
  }

  #catalog: ImageCatalog | undefined;
  #publisher: ImagePublisher | undefined;
  #version = -1;
  #writes: Promise<void> = Promise.resolve();
  #writeError: Error | undefined;
  #pending = 0;
  /** Files in line with the catalog, by path under images/, with the mtime they had then. */
  readonly #synced = new Map<string, number>();
  /**
   * What resolve() and get() read from the files lately (a ref's id, a manifest's text), for at
   * most RECENT_MS: every create resolves its image, and reading a ref file, checking the manifest
   * and reading it were three file reads per create (dsec bench cluster's profile). Emptied by
   * every change made here (put, tag, untag, remove, a catalog sync), so this process sees its
   * own changes at once; one made by another process (a tool writing the files) shows within
   * RECENT_MS, as another replica's shows at the next catalog sync. Misses are not kept.
   */
  readonly #recent = new Map<string, { at: number; value: string }>();
  /** manifest()'s frozen manifests, each with the text it was parsed from. */
  readonly #frozen = new Map<ImageId, { text: string; manifest: Readonly<ImageManifest> }>();

  #remembered(key: string, read: () => string | undefined): string | undefined {
    const now = Date.now();
    const hit = this.#recent.get(key);
    if (hit && now - hit.at < RECENT_MS) return hit.value;
    const value = read();
    if (value === undefined) this.#recent.delete(key);
    else {
      if (this.#recent.size >= RECENT_MAX) this.#recent.clear();
      this.#recent.set(key, { at: now, value });
    }
    return value;
  }

  /** Makes `catalog` the truth for image records (files are imported first: see the class). */
  async attachCatalog(catalog: ImageCatalog, publisher?: ImagePublisher): Promise<void> {
    this.#catalog = catalog;
    this.#publisher = publisher;
    await this.refresh();
  }

  /** The change as the catalog gets it: a new image's blobs published first (ImagePublisher), its layer sizes recorded. */
  async #published(change: ImageChange): Promise<ImageChange> {
    if (!this.#publisher || change.op !== 'put') return change;
    const layerSizes = await this.#publisher.publish(change.id, change.manifest);
    return { ...change, manifest: { ...change.manifest, layerSizes } };
  }

  /** Whether writes are on their way to the catalog. */
  get dirty(): boolean {
    return this.#pending > 0;
  }

  /** Waits until every write so far has reached the catalog; throws the first that failed. */
  async flush(): Promise<void> {
    await this.#writes;
    const err = this.#writeError;
    this.#writeError = undefined;
    if (err) throw err;
  }

  /**
   * Imports files the catalog has not seen, then, when the catalog changed since the last look,
   * brings the files in line with it. A no-op without a catalog. Calls run one after another, so
   * a caller that just wrote files (an image job) returns once they are in the catalog, even when
   * the periodic refresh found them first.
   */
  refresh(): Promise<void> {
    const run = this.#refreshing.then(
      () => this.#refreshOnce(),
      () => this.#refreshOnce(),
    );
    this.#refreshing = run.catch(() => {});
    return run;
  }

  #refreshing: Promise<void> = Promise.resolve();

  async #refreshOnce(): Promise<void> {
    const catalog = this.#catalog;
    if (!catalog) return;
    await this.flush();
    const imports = this.#fileChanges();
    if (imports.length) {
      try {
        await catalog.apply(await Promise.all(imports.map((c) => this.#published(c))));
      } catch (err) {
        // Looked at again next time (the registry may be back by then).
        for (const c of imports)
          this.#synced.delete(
            c.op === 'put'
              ? `${c.id.slice('sha256:'.length)}.json`
              : c.op === 'tag'
                ? `refs/${c.name}`
                : c.op === 'build'
                  ? `builds/${c.key}`
                  : '',
          );
        throw err;
      }
    }
    if (!imports.length && (await catalog.version()) === this.#version) return;
    const snap = await catalog.load();
    this.#syncFiles(snap);
    this.#version = snap.version;
  }

  #toCatalog(change: ImageChange): void {
    const catalog = this.#catalog;
    if (!catalog) return;
    this.#pending++;
    this.#writes = this.#writes
      .then(async () => catalog.apply([await this.#published(change)]))
      .then(() => (change.op === 'remove' ? this.#publisher?.withdraw(change.id) : undefined))
      .catch((err: unknown) => {
        this.#writeError ??= err as Error;
        // An image that did not reach the catalog (its blobs could not be published, say) is
        // looked at again by the next refresh, as a file the catalog has not seen.
        if (change.op === 'put') this.#synced.delete(`${change.id.slice('sha256:'.length)}.json`);
      })
      .finally(() => void this.#pending--);
  }

  /** Notes a file as in line with the catalog (this process wrote or checked it). */
  #mark(rel: string): void {
    try {
      this.#synced.set(rel, statSync(join(this.dir, rel)).mtimeMs);
    } catch {
      this.#synced.delete(rel);
    }
  }

  /** Files that are new, or changed by someone else, since they were last in line with the catalog. */
  #fileChanges(): ImageChange[] {
    const out: ImageChange[] = [];
    for (const f of readdirSync(this.dir)) {
      if (!/^[0-9a-f]{64}\.json$/.test(f) || this.#synced.has(f)) continue;
      try {
        const m = JSON.parse(readFileSync(join(this.dir, f), 'utf8')) as Partial<ImageManifest>;
        if (!Array.isArray(m.layers) || typeof m.config !== 'object' || typeof m.createdAt !== 'string') continue; // corrupt: get() says so
        const writtenAt = new Date(statSync(join(this.dir, f)).mtimeMs).toISOString();
        out.push({
          op: 'put',
          id: `sha256:${f.slice(0, 64)}`,
          manifest: { layers: m.layers, config: m.config, createdAt: m.createdAt },
          imported: true,
          writtenAt,
        });
        this.#mark(f);
      } catch {
        // Being written by a tool right now, or corrupt (get() says so): looked at again next time.
      }
    }
    for (const [sub, kind] of [
      ['refs', 'tag'],
      ['builds', 'build'],
    ] as const) {
      for (const f of readdirSync(join(this.dir, sub))) {
        if (f.includes('.tmp-')) continue;
        const rel = `${sub}/${f}`;
        let mtime: number;
        let target: string;
        const known = this.#synced.get(rel);
        try {
          mtime = statSync(join(this.dir, rel)).mtimeMs;
          if (known === mtime) continue; // in line already: only its mtime is read, every second
          target = readFileSync(join(this.dir, rel), 'utf8').trim();
        } catch {
          continue;
        }
        if (!/^sha256:[0-9a-f]{64}$/.test(target)) continue;
        // First met: the catalog's word wins if it has one; re-pointed by a tool since: moved.
        const imported = known === undefined;
        const writtenAt = new Date(mtime).toISOString();
        out.push(
          kind === 'tag'
            ? { op: 'tag', name: f, id: target as ImageId, imported, writtenAt }
            : { op: 'build', key: f, id: target as ImageId, imported },
        );
        this.#synced.set(rel, mtime);
      }
    }
    return out;
  }

  /** Writes what the catalog has and the files lack; deletes files of entries the catalog deleted. */
  #syncFiles(snap: ImageCatalogSnapshot): void {
    this.#recent.clear();
    const want = new Map<string, string>();
    for (const [id, m] of snap.images) want.set(`${id.slice('sha256:'.length)}.json`, JSON.stringify(m, null, 2));
    for (const [name, id] of snap.names) want.set(`refs/${name}`, id);
    for (const [key, id] of snap.builds) want.set(`builds/${key}`, id);
    for (const [rel, body] of want) {
      const path = join(this.dir, rel);
      const manifest = !rel.includes('/');
      if (manifest ? existsSync(path) : readOr(path) === body) {
        this.#mark(rel);
        continue;
      }
      // A name a tool re-pointed since the last look is left for the next import to move.
      const known = this.#synced.get(rel);
      if (!manifest && known !== undefined && existsSync(path) && statSync(path).mtimeMs !== known) continue;
      writeFileAtomic(path, body);
      this.#mark(rel);
    }
    for (const rel of [...this.#synced.keys()]) {
      if (want.has(rel)) continue;
      // In line before, absent now: deleted at another replica (or a tombstoned import).
      rmSync(join(this.dir, rel), { force: true });
      this.#synced.delete(rel);
    }
  }

  /** The id `put` gives this manifest (the sha256 of its canonical JSON), without storing it. */
  idOf(manifest: Omit<ImageManifest, 'createdAt'>): ImageId {
    return `sha256:${createHash('sha256')
      .update(JSON.stringify({ layers: manifest.layers, config: manifest.config }))
      .digest('hex')}`;
  }

  /** Stores a manifest (idempotent) and returns its id. */
  put(manifest: Omit<ImageManifest, 'createdAt'>): ImageId {
    this.#recent.clear();
    // With a remote blob store, a layer of a known image counts (a snapshot at a replica that
    // never fetched its base layers); publishing the image checks that the store has it.
    let known: Set<LayerDigest> | undefined;
    for (const layer of manifest.layers) {
      if (this.layers.has(layer)) continue;
      if (this.layers.remote && (known ??= this.referencedLayers()).has(layer)) continue;
      throw new Error(`image refers to a layer not in the store: ${layer}`);
    }
    const body = { layers: manifest.layers, config: manifest.config };
    const hex = this.idOf(body).slice('sha256:'.length);
    const file = join(this.dir, `${hex}.json`);
    if (!existsSync(file)) {
      const manifest = { ...body, createdAt: new Date().toISOString() };
      writeFileAtomic(file, JSON.stringify(manifest, null, 2));
      this.#mark(`${hex}.json`);
      this.#toCatalog({ op: 'put', id: `sha256:${hex}`, manifest });
    }
    return `sha256:${hex}`;
  }

  tag(name: string, id: ImageId): void {
    this.#recent.clear();
    if (!isImageName(name)) throw new Error(`invalid image name ${JSON.stringify(name)}`);
    writeFileAtomic(join(this.refsDir, normalizeName(name)), id);
    this.#mark(`refs/${normalizeName(name)}`);
    this.#toCatalog({ op: 'tag', name: normalizeName(name), id });
  }

  /** Resolves a name or id to an image id, or undefined. */
  resolve(ref: string): ImageId | undefined {
    return this.#remembered(`ref:${ref}`, () => this.#resolveNow(ref)) as ImageId | undefined;
  }

  #resolveNow(ref: string): ImageId | undefined {
    if (/^sha256:[0-9a-f]{64}$/.test(ref)) return existsSync(this.#file(ref as ImageId)) ? (ref as ImageId) : undefined;
    if (!isImageName(ref)) return undefined;
    try {
      const id = readFileSync(join(this.refsDir, normalizeName(ref)), 'utf8').trim() as ImageId;
      return existsSync(this.#file(id)) ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * The manifest to read, not to change: one object shared by every caller, deep-frozen (a change
   * to any part throws; its type does not say so, since the edge protocol's types it flows into
   * are mutable), parsed once from the text get() reads, where get() parses a copy per call. A
   * create's spec is composed from its image's manifest on every create (SandboxSpecs).
   */
  manifest(id: ImageId): Readonly<ImageManifest> | undefined {
    const text = this.#text(id);
    if (text === undefined) return undefined;
    const kept = this.#frozen.get(id);
    // The same text as when it was parsed (the very string #recent holds): the same manifest.
    if (kept?.text === text) return kept.manifest;
    const manifest = deepFreeze(this.#parse(id, text));
    if (this.#frozen.size >= RECENT_MAX) this.#frozen.clear();
    this.#frozen.set(id, { text, manifest });
    return manifest;
  }

  /** The manifest, or undefined when there is none; a manifest that cannot be read throws, naming the file. */
  get(id: ImageId): ImageManifest | undefined {
    const text = this.#text(id);
    return text === undefined ? undefined : this.#parse(id, text);
  }

  /** A manifest's text (through #recent), or undefined when there is none; one that cannot be read throws, naming the file. */
  #text(id: ImageId): string | undefined {
    try {
      // The text is kept, not the object: each caller of get() gets a manifest of its own to change.
      return this.#remembered(`manifest:${id}`, () => readFileSync(this.#file(id), 'utf8'));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR') return undefined;
      throw new CorruptManifestError(id, this.#file(id), (err as Error).message);
    }
  }

  #parse(id: ImageId, text: string): ImageManifest {
    try {
      return JSON.parse(text) as ImageManifest;
    } catch (err) {
      throw new CorruptManifestError(id, this.#file(id), (err as Error).message);
    }
  }

  info(id: ImageId): ImageInfo | undefined {
    const m = this.get(id);
    if (!m) return undefined;
    const names = this.#refs()
      .filter(([, target]) => target === id)
      .map(([name]) => name);
    let sizeBytes = 0;
    for (const [i, l] of m.layers.entries()) sizeBytes += this.layers.has(l) ? this.layers.size(l) : (m.layerSizes?.[i] ?? 0);
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
    this.#recent.clear();
    rmSync(join(this.refsDir, normalizeName(name)), { force: true });
    this.#synced.delete(`refs/${normalizeName(name)}`);
    this.#toCatalog({ op: 'untag', name: normalizeName(name) });
  }

  /** Deletes a manifest and every name pointing at it (its layers stay until GC). */
  remove(id: ImageId): void {
    this.#recent.clear();
    for (const [name, target] of this.#refs()) if (target === id) this.untag(name);
    rmSync(this.#file(id), { force: true });
    this.#synced.delete(`${id.slice('sha256:'.length)}.json`);
    this.#toCatalog({ op: 'remove', id });
  }

  /**
   * Remembers that a builder made image `id` from inputs hashing to `cacheKey`. A build trusts a
   * name only when it still points at the image recorded here: a name that a snapshot, an import
   * or `dsec image rm` re-pointed is not the builder's output, whatever labels its config carries.
   */
  recordBuild(cacheKey: string, id: ImageId): void {
    if (!/^[0-9a-f]{64}$/.test(cacheKey)) throw new Error(`invalid build cache key ${JSON.stringify(cacheKey)}`);
    writeFileAtomic(join(this.buildsDir, cacheKey), id);
    this.#mark(`builds/${cacheKey}`);
    this.#toCatalog({ op: 'build', key: cacheKey, id });
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

function readOr(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** How long resolve() and get() answer from what they read before (see ImageStore's #recent). */
const RECENT_MS = 1000;
/** Refs and manifests kept at most (a process that resolves many names starts over). */
const RECENT_MAX = 1024;
