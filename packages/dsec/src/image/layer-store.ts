import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  createReadStream,
  createWriteStream,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  readdirSync,
} from 'node:fs';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { join } from 'node:path';
import { stagingPrefix, sweepDeadStaging } from './staging.js';
import { writeFileAtomic } from './atomic-file.js';
import { computeChunkIndex, DEFAULT_CHUNK_SIZE, isChunkIndex, type ChunkIndex } from './chunk-index.js';
import type { BlobSource } from './blob-source.js';
import { isLayerDigest, type LayerDigest } from './layer-digest.js';

// The digest type lives in layer-digest.ts (blob-source.ts needs it, and the store needs BlobSource).
export { isLayerDigest, type LayerDigest };

/**
 * Content-addressed store of EROFS layer blobs in a local directory (which may be a shared POSIX
 * mount such as NFS or CephFS). A blob's name is the sha256 of its bytes, so a blob is written
 * once, never changed, and safe to share between nodes.
 */
export class LayerStore {
  readonly dir: string;
  readonly tmpDir: string;

  /** Chunk size of the per-chunk digest lists recorded for new layers (lazy nodes fetch by chunk). */
  readonly chunkSize: number;
  /** Indexes being computed, so concurrent first requests for an older layer's index share one pass. */
  readonly #indexing = new Map<LayerDigest, Promise<ChunkIndex>>();
  /** Blobs being fetched from the remote store, so concurrent readers share one download. */
  readonly #fetching = new Map<LayerDigest, Promise<boolean>>();

  /**
   * The blob store this directory caches, when it is not the truth itself: a control plane
   * configured with a registry keeps its blobs there (control/cluster/cluster-registry.ts), so
   * replicas share no directory; a blob another replica stored is fetched here when it is read.
   */
  remote: BlobSource | undefined;

  constructor(root: string, opts: { chunkSize?: number } = {}) {
    this.chunkSize = opts.chunkSize ?? DEFAULT_CHUNK_SIZE;
    this.dir = join(root, 'layers');
    this.tmpDir = join(root, 'tmp');
    // Root's alone: a private image's layers are its project's (red team round three: a host user
    // read a snapshot's files from its layer). The kernel mounts them as root.
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    chmodSync(this.dir, 0o700);
    mkdirSync(this.tmpDir, { recursive: true });
    // Scratch of imports and builds killed mid-way (kill -9, a crash) goes when the store is next opened.
    sweepDeadStaging(this.tmpDir);
  }

  path(digest: LayerDigest): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.erofs`);
  }

  has(digest: LayerDigest): boolean {
    return existsSync(this.path(digest));
  }

  size(digest: LayerDigest): number {
    return statSync(this.path(digest)).size;
  }

  /** A fresh path in the store's filesystem to build a blob at before add(). */
  tempPath(suffix = '.erofs'): string {
    return join(this.tmpDir, `${stagingPrefix('blob')}${randomBytes(6).toString('hex')}${suffix}`);
  }

  /** Where the blob's per-chunk digest list is kept, beside the blob. */
  chunkIndexPath(digest: LayerDigest): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.chunks.json`);
  }

  /**
   * Moves a finished blob into the store under its digest, with its per-chunk digest list
   * (`<hex>.chunks.json`) written first, so a blob in the store always has its index; an identical
   * blob is kept once.
   */
  async add(file: string): Promise<LayerDigest> {
    const digest = await sha256File(file);
    const dest = this.path(digest);
    if (existsSync(dest)) {
      rmSync(file, { force: true });
      return digest;
    }
    if (!existsSync(this.chunkIndexPath(digest)))
      writeFileAtomic(this.chunkIndexPath(digest), JSON.stringify(await computeChunkIndex(file, this.chunkSize)));
    renameSync(file, dest);
    return digest;
  }

  /**
   * Writes a stream into the store: hashed while it is written, fsynced, then renamed under its
   * digest (an identical blob is kept once). Returns the digest the bytes have.
   */
  async addStream(body: NodeJS.ReadableStream): Promise<LayerDigest> {
    const tmp = this.tempPath();
    const hash = createHash('sha256');
    try {
      const out = createWriteStream(tmp, { mode: 0o644 });
      await pipeline(
        body,
        new Transform({
          transform(chunk: Buffer, _e, cb) {
            hash.update(chunk);
            cb(null, chunk);
          },
        }),
        out,
      );
      const fd = openSync(tmp, 'r');
      try {
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      const digest: LayerDigest = `sha256:${hash.digest('hex')}`;
      if (existsSync(this.path(digest))) rmSync(tmp, { force: true });
      else {
        renameSync(tmp, this.path(digest));
        await this.chunkIndex(digest); // recorded now, as add() does, not at the first lazy mount
      }
      return digest;
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
  }

  /** The blob's per-chunk digest list: the recorded one, or (a layer made before lists were) computed now and kept. */
  async chunkIndex(digest: LayerDigest): Promise<ChunkIndex> {
    try {
      const recorded: unknown = JSON.parse(readFileSync(this.chunkIndexPath(digest), 'utf8'));
      if (isChunkIndex(recorded)) return recorded;
    } catch {
      // not recorded (an older layer) or unreadable: compute it
    }
    let pending = this.#indexing.get(digest);
    if (!pending) {
      pending = computeChunkIndex(this.path(digest), this.chunkSize)
        .then((index) => {
          writeFileAtomic(this.chunkIndexPath(digest), JSON.stringify(index));
          return index;
        })
        .finally(() => this.#indexing.delete(digest));
      this.#indexing.set(digest, pending);
    }
    return pending;
  }

  /**
   * The layer's prefetch list: the chunks the first workload on it read, in the order it read
   * them (empty until one was recorded). Nodes mounting the layer later fetch these first.
   */
  prefetchList(digest: LayerDigest): number[] {
    try {
      const v = (JSON.parse(readFileSync(this.#prefetchPath(digest), 'utf8')) as { chunks?: unknown }).chunks;
      return Array.isArray(v) ? v.filter((i): i is number => Number.isSafeInteger(i) && (i as number) >= 0) : [];
    } catch {
      return [];
    }
  }

  /** Records the prefetch list unless one is recorded already (the first run's is kept); true if recorded. */
  recordPrefetchList(digest: LayerDigest, chunks: number[]): boolean {
    if (existsSync(this.#prefetchPath(digest))) return false;
    writeFileAtomic(this.#prefetchPath(digest), JSON.stringify({ chunks }));
    return true;
  }

  #prefetchPath(digest: LayerDigest): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.prefetch.json`);
  }

  /**
   * Makes sure the blob is in this directory: true when it is, or was fetched from the remote
   * store (checked against its digest); false when neither has it.
   */
  async fetch(digest: LayerDigest): Promise<boolean> {
    if (this.has(digest)) return true;
    const remote = this.remote;
    if (!remote) return false;
    let pending = this.#fetching.get(digest);
    if (!pending) {
      pending = (async () => {
        let body: NodeJS.ReadableStream;
        try {
          body = await remote.open(digest);
        } catch (err) {
          if ((err as { code?: unknown }).code === 'IMAGE_NOT_FOUND') return false;
          throw err;
        }
        const got = await this.addStream(body);
        if (got !== digest) {
          this.remove(got);
          throw new Error(`the blob store gave bytes hashing to ${got} for ${digest}`);
        }
        return true;
      })().finally(() => this.#fetching.delete(digest));
      this.#fetching.set(digest, pending);
    }
    return pending;
  }

  /** Removes a blob; callers make sure nothing references it. */
  remove(digest: LayerDigest): number {
    const p = this.path(digest);
    try {
      const size = statSync(p).size;
      rmSync(p);
      rmSync(this.chunkIndexPath(digest), { force: true });
      rmSync(this.#prefetchPath(digest), { force: true });
      return size;
    } catch {
      return 0;
    }
  }

  /** How long ago the blob was written, in ms. */
  ageMs(digest: LayerDigest): number {
    return Date.now() - statSync(this.path(digest)).mtimeMs;
  }

  list(): LayerDigest[] {
    return readdirSync(this.dir)
      .filter((f) => f.endsWith('.erofs'))
      .map((f) => `sha256:${f.slice(0, -'.erofs'.length)}` as LayerDigest);
  }
}

export async function sha256File(file: string): Promise<LayerDigest> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return `sha256:${hash.digest('hex')}`;
}
