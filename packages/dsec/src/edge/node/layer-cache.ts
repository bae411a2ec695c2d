import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { closeSync, fsyncSync, linkSync, mkdirSync, openSync, readdirSync, renameSync, rmSync, statSync, utimesSync } from 'node:fs';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { LayerCacheStats } from '@dsec/sdk/schema';
import { isLayerDigest, type LayerDigest } from '../../image/layer-store.js';
import type { BlobSource } from './blob-source.js';

/** 20 GiB: room for hundreds of base/workspace/toolkit layers before anything is evicted. */
export const DEFAULT_LAYER_CACHE_BYTES = 20 * 1024 ** 3;

/** What the cache holds, for operators (`GET /v1/nodes`); the wire schema documents each field. */
export type { LayerCacheStats };

/** A store blob whose bytes do not hash to its name: never mounted. */
export class LayerIntegrityError extends Error {
  override readonly name = 'LayerIntegrityError';
}

interface Entry {
  size: number;
  /** ms since the epoch; persisted as the file's atime. */
  lastUse: number;
  /** A hard link to a blob the store still holds: costs no disk of its own. */
  linked: boolean;
}

export interface LayerCacheOptions {
  /** The edge's node directory; the cache lives in `<nodeDir>/layer-cache`. */
  nodeDir: string;
  /** Where blobs come from: the local layer store, or the control plane's blob endpoint. */
  source: BlobSource;
  budgetBytes: number;
  /** Whether the layer is mounted (or being mounted): such a layer is never evicted. */
  inUse: (digest: LayerDigest) => boolean;
  log?: Logger;
}

/**
 * The node-local copy of the layer blobs this node mounts. The layer store may be a shared
 * network mount (NFS, CephFS, 3FS); mounting from it would make every page fault of every
 * sandbox a network read and a store outage a node outage. So a blob is brought in once per node:
 * a hard link when the store is on the cache's filesystem (no bytes move), otherwise a copy that
 * is hashed while it is written and renamed into place only when it matches its digest.
 *
 * Budget: `chargedBytes` counts the blobs the cache alone keeps alive (copies, and links whose
 * store name GC removed; at start, those with link count 1). A link to a blob the store still holds costs no disk, and
 * evicting it would free nothing, so it is free. When charged bytes exceed the budget, the least
 * recently used layers that are not mounted are removed until they fit; a mounted layer is never
 * removed, so a node whose mounted layers alone exceed the budget stays over it (`overBudget`).
 *
 * Last use is the file's atime, set explicitly when the layer is mounted and when its last mount
 * goes (it was in use until then): it survives an edge restart with no
 * index to keep consistent, and leaves mtime alone, which GC reads (through a shared inode when
 * linked) as the blob's age.
 */
export class LayerCache {
  readonly dir: string;
  readonly #tmp: string;
  readonly #entries = new Map<LayerDigest, Entry>();
  readonly #pending = new Map<LayerDigest, Promise<string>>();
  #evictions = 0;
  /** ensure() calls answered from the cache, those that fetched (or waited on a fetch), and the bytes fetches moved. */
  #hits = 0;
  #misses = 0;
  #fetchedBytes = 0;
  /** The last lastUse handed out (ms). */
  #clock = 0;
  /** Set while only mounted layers are left over budget, so the warning is logged once. */
  #warnedOver = false;

  constructor(private readonly opts: LayerCacheOptions) {
    this.dir = join(opts.nodeDir, 'layer-cache');
    this.#tmp = join(this.dir, '.tmp');
    mkdirSync(this.#tmp, { recursive: true });
  }

  get budgetBytes(): number {
    return this.opts.budgetBytes;
  }

  path(digest: LayerDigest): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.erofs`);
  }

  /** Every cached layer (placement prefers nodes that already hold an image's layers). */
  digests(): LayerDigest[] {
    return [...this.#entries.keys()];
  }

  has(digest: LayerDigest): boolean {
    return this.#entries.has(digest);
  }

  /** A local path to the layer's blob, fetched from the store unless cached; marks it used. */
  async ensure(digest: LayerDigest): Promise<string> {
    if (this.#entries.has(digest)) {
      if (this.#touch(digest)) {
        this.#hits++;
        return this.path(digest);
      }
      this.#entries.delete(digest); // removed behind the edge's back: fetch it again
    }
    this.#misses++;
    // Concurrent callers share one fetch.
    let pending = this.#pending.get(digest);
    if (!pending) {
      pending = this.#fetch(digest).finally(() => this.#pending.delete(digest));
      this.#pending.set(digest, pending);
    }
    return pending;
  }

  /**
   * Called when the layer's last mount goes: it was in use until now; a blob GC removed from the
   * store leaves the cache too; a layer that was held only because it was mounted may now be evicted.
   */
  unmounted(digest: LayerDigest): void {
    if (!this.#entries.has(digest)) return;
    this.#touch(digest); // in use until now
    this.#sweep();
    this.#evictToBudget();
  }

  /**
   * At edge start (after the layer mounts are reconciled): loads the entries on disk with their
   * last use, removes unfinished copies and files that are not cache entries, drops layers the
   * store no longer has unless mounted, and evicts down to the budget.
   */
  reconcile(): void {
    this.#entries.clear();
    rmSync(this.#tmp, { recursive: true, force: true });
    mkdirSync(this.#tmp);
    for (const name of readdirSync(this.dir)) {
      if (name === '.tmp') continue;
      const digest = `sha256:${name.slice(0, -'.erofs'.length)}`;
      const file = join(this.dir, name);
      const st = statSync(file, { throwIfNoEntry: false });
      if (!name.endsWith('.erofs') || !isLayerDigest(digest) || !st?.isFile()) {
        rmSync(file, { recursive: true, force: true });
        continue;
      }
      this.#entries.set(digest, { size: st.size, lastUse: st.atimeMs, linked: st.nlink > 1 });
      this.#clock = Math.max(this.#clock, st.atimeMs);
    }
    this.#sweep();
    this.#evictToBudget();
  }

  stats(): LayerCacheStats {
    let bytes = 0;
    let mounted = 0;
    for (const [digest, e] of this.#entries) {
      bytes += e.size;
      if (this.opts.inUse(digest)) mounted++;
    }
    const chargedBytes = this.#chargedBytes();
    return {
      entries: this.#entries.size,
      bytes,
      chargedBytes,
      budgetBytes: this.opts.budgetBytes,
      mounted,
      evictions: this.#evictions,
      hits: this.#hits,
      misses: this.#misses,
      fetchedBytes: this.#fetchedBytes,
      overBudget: chargedBytes > this.opts.budgetBytes,
    };
  }

  async #fetch(digest: LayerDigest): Promise<string> {
    const src = this.opts.source.localPath(digest);
    const dest = this.path(digest);
    const srcStat = src === undefined ? undefined : statSync(src, { throwIfNoEntry: false });
    let how: 'link' | 'copy' | 'download' = src === undefined ? 'download' : 'copy';
    if (src !== undefined && srcStat && srcStat.dev === statSync(this.dir).dev) {
      try {
        linkSync(src, dest);
        how = 'link';
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EEXIST') how = 'link';
        // EXDEV: same filesystem but another mount of it (a bind mount); copy instead.
        else if (code !== 'EXDEV' && code !== 'EPERM') throw err;
      }
    }
    if (how !== 'link')
      await this.#copyVerified(
        digest,
        src !== undefined && srcStat ? createReadStream(src) : await this.opts.source.open(digest),
        src ?? 'the blob endpoint',
        dest,
      );
    const size = statSync(dest).size;
    if (how !== 'link') this.#fetchedBytes += size;
    this.#entries.set(digest, { size, lastUse: 0, linked: how === 'link' });
    this.#touch(digest);
    this.opts.log?.debug({ layer: digest, how, bytes: size }, 'layer cached');
    this.#sweep();
    this.#evictToBudget();
    return dest;
  }

  /** Copies a blob's bytes to a temp file, hashing as it goes; renamed into place only if it matches. */
  async #copyVerified(digest: LayerDigest, bytes: NodeJS.ReadableStream, src: string, dest: string): Promise<void> {
    const tmp = join(this.#tmp, `${randomBytes(6).toString('hex')}.erofs`);
    try {
      const hash = createHash('sha256');
      const hashing = new Transform({
        transform(chunk: Buffer, _enc, done) {
          hash.update(chunk);
          done(null, chunk);
        },
      });
      await pipeline(bytes, hashing, createWriteStream(tmp, { mode: 0o444 }));
      const got = `sha256:${hash.digest('hex')}`;
      if (got !== digest) {
        throw new LayerIntegrityError(
          `layer ${digest}: the blob from ${src} hashes to ${got}; it is corrupt or truncated and will not be mounted`,
        );
      }
      const fd = openSync(tmp, 'r');
      try {
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, dest);
    } finally {
      rmSync(tmp, { force: true });
    }
  }

  /** Marks the entry used now (memory and atime); false when its file is gone. */
  #touch(digest: LayerDigest): boolean {
    const e = this.#entries.get(digest);
    const st = statSync(this.path(digest), { throwIfNoEntry: false });
    if (!e || !st) return false;
    // Strictly increasing across entries, so uses within one millisecond keep their order.
    this.#clock = Math.max(Date.now(), this.#clock + 1);
    e.lastUse = this.#clock;
    utimesSync(this.path(digest), e.lastUse / 1000, st.mtime);
    return true;
  }

  /** Bytes only the cache keeps alive: copies, and links whose store name is gone. */
  #chargedBytes(): number {
    let charged = 0;
    for (const e of this.#entries.values()) if (!e.linked) charged += e.size;
    return charged;
  }

  /**
   * Layers GC removed from the store: dropped unless mounted; a mounted link now costs its bytes.
   * One stat per entry, so it runs when a blob is fetched, a layer's last mount goes, and at
   * start; never on the create path of a cached layer, nor in stats() (placement asks per create).
   */
  #sweep(): void {
    for (const [digest, e] of [...this.#entries]) {
      if (this.opts.source.has(digest) !== false) continue; // present, or a remote store that cannot tell
      if (this.opts.inUse(digest)) e.linked = false;
      else this.#remove(digest);
    }
  }

  #evictToBudget(): void {
    let charged = this.#chargedBytes();
    if (charged <= this.opts.budgetBytes) {
      this.#warnedOver = false;
      return;
    }
    const candidates = [...this.#entries]
      .filter(([digest]) => !this.opts.inUse(digest) && !this.#pending.has(digest))
      .sort((a, b) => a[1].lastUse - b[1].lastUse);
    for (const [digest, e] of candidates) {
      if (charged <= this.opts.budgetBytes) break;
      if (e.linked) continue; // costs nothing: evicting it frees no disk
      this.#remove(digest);
      this.#evictions++;
      charged -= e.size;
      this.opts.log?.info({ layer: digest, bytes: e.size }, 'layer evicted from the node cache');
    }
    const over = charged > this.opts.budgetBytes;
    if (over && !this.#warnedOver) {
      this.opts.log?.warn(
        { chargedBytes: charged, budgetBytes: this.opts.budgetBytes },
        'layer cache over budget: every remaining layer is mounted',
      );
    }
    this.#warnedOver = over;
  }

  #remove(digest: LayerDigest): void {
    this.#entries.delete(digest);
    rmSync(this.path(digest), { force: true });
  }
}
