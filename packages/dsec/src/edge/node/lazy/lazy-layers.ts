import { constants, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { LazyLayerStats } from '@dsec/sdk/schema';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import type { ChunkIndex } from '../../../image/chunk-index.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { LayerBlobs } from '../layer-mounts.js';
import { BlobClient } from './blob-client.js';
import { ChunkDaemon, type ChunkSource } from './chunk-daemon.js';

export interface LazyLayersOptions {
  /** The edge's node directory; everything lazy lives in `<nodeDir>/lazy`. */
  nodeDir: string;
  /** The blob store (the control plane's blob endpoint) and its token, asked when first needed. */
  source: () => ChunkSource;
  /** The layer cache budget, shared with the eager cache: chunk bytes count against it. */
  budgetBytes: number;
  /** Bytes the eager layer cache charges against the same budget. */
  otherChargedBytes: () => number;
  /** Whether the layer is mounted (or being mounted): its chunks are never evicted. */
  inUse: (digest: LayerDigest) => boolean;
  /** The daemon died: every sandbox reading a lazy layer has lost its image. */
  onDaemonDeath: (reason: string) => void;
  retries?: number;
  attemptTimeoutMs?: number;
  connectTimeoutMs?: number;
  log?: Logger;
  binary?: string;
}

interface Layer {
  index: Pick<ChunkIndex, 'chunkSize' | 'size'> & { chunks: number };
  lastUse: number;
}

/**
 * Layers fetched lazily (`--layer-fetch lazy`): instead of a whole blob, the edge fetches only the
 * blob's chunk index from the store and hands layer mounts a file on dsec-chunk-fuse's mount,
 * whose chunks come on first read (see native/chunk-fuse.c). The chunk cache shares the layer
 * cache's budget: when the two together exceed it, the chunks of the least recently used layers
 * that nothing mounts are deleted (fetched again if a later sandbox reads them).
 *
 * Access trace (prefetch): the daemon logs which chunks were read through the mount, in first-read
 * order. When a layer's last mount goes, that log becomes the layer's prefetch list in the blob
 * store (once per layer; closing waits for it to land), and a node mounting the layer later starts
 * fetching those chunks in the background. The daemon counts chunks read apart from chunks fetched,
 * so what a node's workloads read does not depend on whether a trace was there to prefetch.
 */
export class LazyLayers implements LayerBlobs {
  readonly daemon: ChunkDaemon;
  readonly #layers = new Map<LayerDigest, Layer>();
  readonly #pending = new Map<LayerDigest, Promise<string>>();
  readonly #published = new Set<LayerDigest>();
  /** Prefetch lists on their way to the store: an edge closing waits for them, or they would be lost. */
  readonly #publishing = new Set<Promise<void>>();
  #clock = 0;
  #evictedChunks = 0;

  constructor(private readonly opts: LazyLayersOptions) {
    const dir = join(opts.nodeDir, 'lazy');
    mkdirSync(dir, { recursive: true });
    this.daemon = new ChunkDaemon({
      dir,
      source: opts.source,
      retries: opts.retries ?? 3,
      attemptTimeoutMs: opts.attemptTimeoutMs ?? 15_000,
      connectTimeoutMs: opts.connectTimeoutMs ?? 2_000,
      onDeath: opts.onDaemonDeath,
      ...(opts.log ? { log: opts.log } : {}),
      ...(opts.binary ? { binary: opts.binary } : {}),
    });
  }

  /** Whether a layer mount's source is a file on this node's lazy mount. */
  isLazySource(source: string): boolean {
    return source.startsWith(this.daemon.mountPoint + '/');
  }

  path(digest: LayerDigest): string {
    return join(this.daemon.mountPoint, `${hexOf(digest)}.erofs`);
  }

  async ensure(digest: LayerDigest): Promise<string> {
    await this.daemon.ensure();
    let pending = this.#pending.get(digest);
    if (!pending) {
      pending = this.#prepare(digest).finally(() => this.#pending.delete(digest));
      this.#pending.set(digest, pending);
    }
    return pending;
  }

  unmounted(digest: LayerDigest): void {
    this.#touch(digest);
    const publishing = this.#publishPrefetch(digest).finally(() => this.#publishing.delete(publishing));
    this.#publishing.add(publishing);
    this.#evictToBudget();
  }

  /** Resolves once every prefetch list sent so far reached the store (or failed to). */
  async published(): Promise<void> {
    while (this.#publishing.size) await Promise.all(this.#publishing);
  }

  /**
   * At edge start (after layer mounts are reconciled): adopts a daemon that still serves, loads
   * the cached layers' indexes, and evicts down to the budget.
   */
  reconcile(): void {
    if (!this.daemon.adopt()) this.#layers.clear();
    for (const hex of safeReaddir(this.daemon.cacheDir)) {
      if (!/^[0-9a-f]{64}$/.test(hex)) continue; // source, stats
      const digest = `sha256:${hex}` as LayerDigest;
      const index = readDaemonIndex(join(this.daemon.cacheDir, hex, 'index'));
      if (index) this.#layers.set(digest, { index, lastUse: 0 });
      else rmSync(join(this.daemon.cacheDir, hex), { recursive: true, force: true });
    }
    this.#evictToBudget();
  }

  /** Bytes of chunks on disk (each layer's chunk files, the last one possibly short). */
  chunkBytes(): number {
    let total = 0;
    for (const [digest, l] of this.#layers) total += this.#cachedBytes(digest, l);
    return total;
  }

  stats(): LazyLayerStats {
    const fetched = this.#daemonStats();
    const layers = [...this.#layers].map(([digest, l]) => {
      const f = fetched.get(hexOf(digest));
      return {
        digest,
        sizeBytes: l.index.size,
        cachedBytes: this.#cachedBytes(digest, l),
        fetchedBytes: f?.bytes ?? 0,
        fetchedChunks: f?.chunks ?? 0,
        readBytes: f?.readBytes ?? 0,
        readChunks: f?.readChunks ?? 0,
        prefetchedBytes: f?.prefetchedBytes ?? 0,
        failedFetches: f?.failed ?? 0,
        digestMismatches: f?.mismatches ?? 0,
        mounted: this.opts.inUse(digest),
      };
    });
    return {
      daemon: this.daemon.running ? 'running' : 'stopped',
      chunkBytes: layers.reduce((n, l) => n + l.cachedBytes, 0),
      fetchedBytes: layers.reduce((n, l) => n + l.fetchedBytes, 0),
      evictedChunks: this.#evictedChunks,
      layers,
      sandboxes: [...this.#sandboxStats()].map(([id, f]) => ({
        id,
        readBytes: f.bytes,
        readChunks: f.chunks,
        fetchedBytes: f.bytes,
        fetchedChunks: f.chunks,
      })),
    };
  }

  /** At edge close with lazy layers still mounted: the daemon keeps serving them, unwatched. */
  detach(): void {
    this.daemon.detach();
  }

  /** At edge close with every layer unmounted: stops the daemon. */
  async stop(): Promise<void> {
    await this.published();
    await this.daemon.stop();
  }

  async #prepare(digest: LayerDigest): Promise<string> {
    const dir = join(this.daemon.cacheDir, hexOf(digest));
    const indexFile = join(dir, 'index');
    let index = this.#layers.get(digest)?.index ?? readDaemonIndex(indexFile);
    if (!index || !existsSync(indexFile)) {
      const { chunks, prefetch } = await this.#client().chunkIndex(digest);
      mkdirSync(dir, { recursive: true });
      // The prefetch list first: the daemon starts prefetching when it first loads the index.
      if (prefetch.length)
        writeFileAtomic(join(dir, 'prefetch'), prefetch.filter((i) => i < chunks.digests.length).join('\n') + '\n', 0o600);
      writeFileAtomic(indexFile, daemonIndexText(chunks), 0o600);
      index = { chunkSize: chunks.chunkSize, size: chunks.size, chunks: chunks.digests.length };
      if (prefetch.length) this.#published.add(digest); // the store has its list already
    }
    this.#layers.set(digest, { index, lastUse: 0 });
    this.#touch(digest);
    this.#evictToBudget();
    // The superblock's chunk, read here on the thread pool: mount(2) then finds it cached instead
    // of holding the edge's event loop while it is fetched. O_DIRECT, so no readahead pulls more.
    const fh = await open(this.path(digest), constants.O_RDONLY | constants.O_DIRECT);
    try {
      await fh.read(Buffer.alloc(4096), 0, 4096, 0);
    } finally {
      await fh.close();
    }
    return this.path(digest);
  }

  /** The first workload's chunks become the layer's prefetch list in the store (best effort). */
  async #publishPrefetch(digest: LayerDigest): Promise<void> {
    if (this.#published.has(digest)) return;
    let touched: number[];
    try {
      touched = readFileSync(join(this.daemon.cacheDir, hexOf(digest), 'touched'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map(Number);
    } catch {
      return;
    }
    if (touched.length === 0) return;
    this.#published.add(digest);
    try {
      await this.#client().putPrefetch(digest, touched);
    } catch (err) {
      this.opts.log?.warn({ layer: digest, err: (err as Error).message }, "could not record the layer's prefetch list");
    }
  }

  #client(): BlobClient {
    const { url, token } = this.opts.source();
    return new BlobClient(url, token);
  }

  #touch(digest: LayerDigest): void {
    const l = this.#layers.get(digest);
    if (!l) return;
    this.#clock = Math.max(Date.now(), this.#clock + 1);
    l.lastUse = this.#clock;
  }

  #cachedBytes(digest: LayerDigest, l: Layer): number {
    let bytes = 0;
    const last = l.index.chunks - 1;
    for (const name of safeReaddir(join(this.daemon.cacheDir, hexOf(digest)))) {
      if (!/^c\d+$/.test(name)) continue;
      const i = Number(name.slice(1));
      bytes += i === last ? l.index.size - last * l.index.chunkSize : l.index.chunkSize;
    }
    return bytes;
  }

  #evictToBudget(): void {
    let charged = this.opts.otherChargedBytes() + this.chunkBytes();
    if (charged <= this.opts.budgetBytes) return;
    const candidates = [...this.#layers]
      .filter(([d]) => !this.opts.inUse(d) && !this.#pending.has(d))
      .sort((a, b) => a[1].lastUse - b[1].lastUse);
    for (const [digest, l] of candidates) {
      if (charged <= this.opts.budgetBytes) break;
      const dir = join(this.daemon.cacheDir, hexOf(digest));
      const bytes = this.#cachedBytes(digest, l);
      let n = 0;
      for (const name of safeReaddir(dir)) {
        if (/^c\d+$/.test(name)) {
          rmSync(join(dir, name), { force: true });
          n++;
        }
      }
      if (n === 0) continue;
      this.#evictedChunks += n;
      charged -= bytes;
      this.opts.log?.info({ layer: digest, chunks: n, bytes }, 'lazy layer chunks evicted from the node cache');
    }
  }

  /** The daemon's counters per sandbox (`sandbox <id> <bytes> <chunks>` lines of DIR/stats). */
  #sandboxStats(): Map<string, { bytes: number; chunks: number }> {
    const out = new Map<string, { bytes: number; chunks: number }>();
    for (const line of this.#statsLines()) {
      const [kind, id, bytes, chunks] = line.split(' ');
      if (kind === 'sandbox' && id && chunks !== undefined) out.set(id, { bytes: Number(bytes), chunks: Number(chunks) });
    }
    return out;
  }

  #statsLines(): string[] {
    try {
      return readFileSync(join(this.daemon.cacheDir, 'stats'), 'utf8').split('\n');
    } catch {
      return [];
    }
  }

  /**
   * The daemon's counters per blob hex (DIR/stats, rewritten after every fetch and first read).
   * A daemon adopted from before the read counters were added writes the first four only.
   */
  #daemonStats(): Map<string, DaemonBlobStats> {
    const out = new Map<string, DaemonBlobStats>();
    for (const line of this.#statsLines()) {
      const [hex, bytes, chunks, failed, mismatches, readBytes, readChunks, prefetchedBytes] = line.split(' ');
      if (hex && hex !== 'sandbox' && mismatches !== undefined)
        out.set(hex, {
          bytes: Number(bytes),
          chunks: Number(chunks),
          failed: Number(failed),
          mismatches: Number(mismatches),
          readBytes: Number(readBytes ?? 0),
          readChunks: Number(readChunks ?? 0),
          prefetchedBytes: Number(prefetchedBytes ?? 0),
        });
    }
    return out;
  }
}

interface DaemonBlobStats {
  bytes: number;
  chunks: number;
  failed: number;
  mismatches: number;
  readBytes: number;
  readChunks: number;
  prefetchedBytes: number;
}

function hexOf(digest: LayerDigest): string {
  return digest.slice('sha256:'.length);
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** The daemon reads plain text, not JSON (see native/chunk-fuse.c). */
function daemonIndexText(index: ChunkIndex): string {
  return `dsec-chunks 1\nsize ${index.size}\nchunk ${index.chunkSize}\n${index.digests.map((d) => d.slice('sha256:'.length)).join('\n')}\n`;
}

function readDaemonIndex(file: string): Layer['index'] | undefined {
  try {
    const lines = readFileSync(file, 'utf8').split('\n');
    const size = Number(lines[1]?.split(' ')[1]);
    const chunkSize = Number(lines[2]?.split(' ')[1]);
    if (lines[0] !== 'dsec-chunks 1' || !Number.isSafeInteger(size) || !Number.isSafeInteger(chunkSize) || chunkSize <= 0) return undefined;
    return { size, chunkSize, chunks: Math.ceil(size / chunkSize) };
  } catch {
    return undefined;
  }
}
