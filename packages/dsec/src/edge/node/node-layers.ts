import { join } from 'node:path';
import type { Logger } from 'pino';
import { mountsUnder } from '../../host/mounts.js';
import type { LayerDigest } from '../../image/layer-store.js';
import type { EdgeInfo } from '../protocol/edge-api.js';
import type { BlobSource } from './blob-source.js';
import { DEFAULT_LAYER_CACHE_BYTES, LayerCache } from './layer-cache.js';
import { LayerMounts } from './layer-mounts.js';
import { clearDeadDaemonMount, liveDaemonPid, type ChunkSource } from './lazy/chunk-daemon.js';
import { LazyLayers } from './lazy/lazy-layers.js';

export interface LazyLayerOptions {
  source: () => ChunkSource;
  retries?: number;
  attemptTimeoutMs?: number;
  connectTimeoutMs?: number;
}

export interface NodeLayersOptions {
  nodeDir: string;
  blobs: BlobSource;
  /** Budget of the node's layer cache; default DEFAULT_LAYER_CACHE_BYTES. */
  layerCacheBytes?: number | undefined;
  /** Whether a backend that does not mount layers here (VMs) holds a layer, so the cache keeps it. */
  layerInUse?: ((digest: LayerDigest) => boolean) | undefined;
  /** Lazy layers (`--layer-fetch lazy`); unset: eager. */
  lazy?: LazyLayerOptions | undefined;
  /** The lazy layer daemon died: its layers are unreadable. */
  onLazyDaemonDeath: (reason: string) => void;
  log: Logger;
}

/**
 * The node's layers: the cache of the store's blobs (eager), the lazy layer store (lazy mode),
 * and one refcounted read-only mount per layer over either. Every backend on the node shares them.
 */
export class NodeLayers {
  readonly cache: LayerCache;
  /** Set in lazy mode: the node's lazy layer store. */
  readonly lazy: LazyLayers | undefined;
  readonly mounts: LayerMounts;

  constructor(private readonly opts: NodeLayersOptions) {
    this.cache = new LayerCache({
      nodeDir: opts.nodeDir,
      source: opts.blobs,
      budgetBytes: opts.layerCacheBytes ?? DEFAULT_LAYER_CACHE_BYTES,
      inUse: (d) => this.mounts.inUse(d) || (opts.layerInUse?.(d) ?? false),
      log: opts.log,
    });
    this.lazy = opts.lazy
      ? new LazyLayers({
          nodeDir: opts.nodeDir,
          source: opts.lazy.source,
          budgetBytes: opts.layerCacheBytes ?? DEFAULT_LAYER_CACHE_BYTES,
          otherChargedBytes: () => this.cache.stats().chargedBytes,
          inUse: (d) => this.mounts.inUse(d),
          onDaemonDeath: (reason) => opts.onLazyDaemonDeath(reason),
          ...(opts.lazy.retries !== undefined ? { retries: opts.lazy.retries } : {}),
          ...(opts.lazy.attemptTimeoutMs !== undefined ? { attemptTimeoutMs: opts.lazy.attemptTimeoutMs } : {}),
          ...(opts.lazy.connectTimeoutMs !== undefined ? { connectTimeoutMs: opts.lazy.connectTimeoutMs } : {}),
          log: opts.log,
        })
      : undefined;
    this.mounts = new LayerMounts(opts.nodeDir, this.lazy ?? this.cache);
  }

  /** The eager cache's stats, with the lazy chunk cache counted against the same budget. `live`: sandboxes still on this node. */
  stats(live: (id: string) => boolean): EdgeInfo['layerCache'] {
    const eager = this.cache.stats();
    if (!this.lazy) return eager;
    const all = this.lazy.stats();
    const lazy = { ...all, sandboxes: all.sandboxes.filter((sb) => live(sb.id)) };
    const chargedBytes = eager.chargedBytes + lazy.chunkBytes;
    return { ...eager, bytes: eager.bytes + lazy.chunkBytes, chargedBytes, overBudget: chargedBytes > eager.budgetBytes, lazy };
  }

  /**
   * Lazy layers mounted from a daemon that is gone (found at start): readable no more. Their
   * mounts' source is a file on the lazy mount, and that mount has no live daemon behind it.
   */
  deadLazyLayers(): Set<LayerDigest> {
    const lazyMount = join(this.opts.nodeDir, 'lazy', 'mnt') + '/';
    const onLazy = mountsUnder(this.mounts.dir).filter((m) => m.source.startsWith(lazyMount));
    if (onLazy.length === 0) return new Set();
    if (this.lazy ? this.lazy.daemon.adopt() : liveDaemonPid(join(this.opts.nodeDir, 'lazy')) !== undefined) return new Set();
    return new Set(onLazy.map((m) => `sha256:${m.mountPoint.slice(this.mounts.dir.length + 1)}` as LayerDigest));
  }

  /** The layers mounted from the lazy layer store now. */
  mountedLazyLayers(): Set<string> {
    const lazy = this.lazy;
    if (!lazy) return new Set();
    return new Set(
      mountsUnder(this.mounts.dir)
        .filter((m) => lazy.isLazySource(m.source))
        .map((m) => `sha256:${m.mountPoint.slice(this.mounts.dir.length + 1)}`),
    );
  }

  /**
   * After adoption: the mounts the adopted sandboxes use stay (`layersInUse`, one list per
   * sandbox), the others go; the cache and the lazy store drop what is not theirs. `lazyDead`:
   * deadLazyLayers() as found before adoption.
   */
  reconcile(layersInUse: LayerDigest[][], lazyDead: Set<LayerDigest>): void {
    this.mounts.reconcile(layersInUse);
    this.cache.reconcile();
    this.lazy?.reconcile();
    if (!this.lazy && lazyDead.size) clearDeadDaemonMount(join(this.opts.nodeDir, 'lazy'));
  }

  /** The lazy layer daemon outlives the edge while sandboxes read from it (the next edge adopts it). */
  async close(): Promise<void> {
    await this.lazy?.published();
    if (this.lazy && this.mounts.mounted().length === 0) await this.lazy.stop();
    else this.lazy?.detach();
  }
}
