import { Counter, Gauge, type Registry } from 'prom-client';
import type { SandboxStatus } from '@dsec/sdk/schema';
import type { EdgeInfo } from '../edge/protocol/schemas.js';

/** What the cluster gauges are read from at each scrape. */
export interface ClusterView {
  /** Every edge with its last heartbeat (EdgeRegistry.describe after refreshLocal). */
  edges(): Promise<{ id: string; pool: string; state: string; info: EdgeInfo }[]>;
  /** Sandbox rows counted by state, edge and project (a grouped count in the store, never every row). */
  sandboxCounts(): Promise<{ status: SandboxStatus; edge: string; project: string; count: number }[]>;
  /** Batches being driven now. */
  batches(): { id: string; count: number; placed: number; running: number; failed: number }[];
  /** The images the store holds, with their layers: lazy bytes are summed per image from these. */
  images(): { id: string; names: string[]; layers: string[]; sizeBytes: number }[];
}

/**
 * Gauges of what the store and the edges hold, set at each scrape rather than kept in step with
 * every change: sandboxes by state, pool and edge, and by project and state; each edge's capacity and utilisation; layer
 * caches and lazy loading; running batches. Edges report through the control plane: their
 * heartbeats already carry these facts every second, so one scrape target covers the cluster
 * and a node needs no second port or credential for Prometheus.
 *
 * An edge's layer-cache and lazy-fetch numbers are counters kept by the edge since it started;
 * they are exported as counters (a restart of the edge resets them, which Prometheus's rate()
 * handles as a counter reset).
 */
export class ClusterMetrics {
  readonly #sandboxes: Gauge<'state' | 'pool' | 'edge'>;
  readonly #projectSandboxes: Gauge<'project' | 'state'>;
  readonly #edges: Gauge<'edge' | 'pool' | 'state'>;
  readonly #edgeGauges: Record<string, Gauge<'edge' | 'pool'>>;
  readonly #edgeCounters: Record<string, Counter<'edge' | 'pool'>>;
  readonly #imageRead: Counter<'edge' | 'pool' | 'image' | 'name'>;
  readonly #imageFetched: Counter<'edge' | 'pool' | 'image' | 'name'>;
  readonly #imageReadRatio: Gauge<'edge' | 'pool' | 'image' | 'name'>;
  readonly #batchItems: Gauge<'batch' | 'state'>;
  readonly #batches: Gauge;

  constructor(
    registry: Registry,
    private readonly view: ClusterView,
  ) {
    const registers = [registry];
    const gauge = (name: string, help: string): Gauge<'edge' | 'pool'> =>
      new Gauge({ name, help, labelNames: ['edge', 'pool'] as const, registers });
    const counter = (name: string, help: string): Counter<'edge' | 'pool'> =>
      new Counter({ name, help, labelNames: ['edge', 'pool'] as const, registers });
    this.#sandboxes = new Gauge({
      name: 'dsec_sandboxes',
      help: 'Sandboxes by state, pool and edge (rows in the state store).',
      labelNames: ['state', 'pool', 'edge'] as const,
      registers,
    });
    this.#projectSandboxes = new Gauge({
      name: 'dsec_project_sandboxes',
      help: 'Sandboxes by project and state (rows in the state store).',
      labelNames: ['project', 'state'] as const,
      registers,
    });
    this.#edges = new Gauge({
      name: 'dsec_edge_up',
      help: '1 for each edge, labelled with its state (ready, draining, lost).',
      labelNames: ['edge', 'pool', 'state'] as const,
      registers,
    });
    this.#edgeGauges = {
      sandboxes: gauge('dsec_edge_sandboxes', 'Sandboxes on the edge at its last heartbeat.'),
      maxSandboxes: gauge('dsec_edge_max_sandboxes', 'Admission limit of the edge (--max-sandboxes).'),
      utilisation: gauge(
        'dsec_edge_utilisation_ratio',
        'The larger of sandbox slots and memory in use, 0..1 (what bursting and placement read).',
      ),
      cpus: gauge('dsec_edge_cpus', 'CPUs of the node.'),
      cpuCommitted: gauge('dsec_edge_cpu_committed', 'Sum of the cpu limits of its sandboxes.'),
      cpuUsage: gauge('dsec_edge_cpu_usage_ratio', "Share of the node's CPU time busy between its last two measurements, 0..1."),
      memoryBytes: gauge('dsec_edge_memory_bytes', 'Memory of the node.'),
      memoryAvailableBytes: gauge('dsec_edge_memory_available_bytes', 'MemAvailable of the node at its last heartbeat.'),
      memoryCommittedBytes: gauge('dsec_edge_memory_committed_bytes', 'Sum of the memory limits of its sandboxes.'),
      pidsInUse: gauge('dsec_edge_pids_in_use', 'Processes and threads on the node.'),
      pidMax: gauge('dsec_edge_pid_max', 'kernel.pid_max of the node.'),
      cacheEntries: gauge('dsec_layer_cache_entries', "Layers in the node's layer cache."),
      cacheBytes: gauge('dsec_layer_cache_bytes', 'Size of every cached layer blob, linked or copied.'),
      cacheChargedBytes: gauge('dsec_layer_cache_charged_bytes', 'Bytes counted against the layer cache budget.'),
      cacheBudgetBytes: gauge('dsec_layer_cache_budget_bytes', 'The layer cache budget (layerCacheMiB).'),
      lazyChunkBytes: gauge('dsec_lazy_chunk_cache_bytes', "Bytes in the node's chunk cache of lazily fetched layers."),
    };
    this.#edgeCounters = {
      cacheHits: counter(
        'dsec_layer_cache_hits_total',
        'Layers mounted on the node (not mounted there already) whose blob the node cache held.',
      ),
      cacheMisses: counter('dsec_layer_cache_misses_total', 'Layers mounted on the node whose blob had to come into the node cache first.'),
      cacheFetchedBytes: counter(
        'dsec_layer_cache_fetched_bytes_total',
        'Bytes copied or downloaded into the node cache (a hard link moves none).',
      ),
      cacheEvictions: counter('dsec_layer_cache_evictions_total', 'Layers evicted to keep the cache within its budget.'),
      lazyFetchedBytes: counter('dsec_lazy_fetched_bytes_total', 'Bytes of lazily loaded layers (FUSE) fetched from the blob store.'),
      lazyEvictedChunks: counter('dsec_lazy_evicted_chunks_total', 'Lazy-layer chunks evicted to keep the layer cache within its budget.'),
      lazyFailedFetches: counter('dsec_lazy_failed_fetches_total', 'Chunk fetches that failed after every retry (the reader got EIO).'),
    };
    const imageLabels = ['edge', 'pool', 'image', 'name'] as const;
    this.#imageRead = new Counter({
      name: 'dsec_lazy_image_read_bytes_total',
      help: "Bytes of an image's lazily loaded layers read on the edge, each chunk once (the sum over its layers; a layer two images share counts in each).",
      labelNames: imageLabels,
      registers,
    });
    this.#imageFetched = new Counter({
      name: 'dsec_lazy_image_fetched_bytes_total',
      help: "Bytes of an image's lazily loaded layers fetched from the blob store by the edge: read, prefetched from the access trace, fetched again after eviction.",
      labelNames: imageLabels,
      registers,
    });
    this.#imageReadRatio = new Gauge({
      name: 'dsec_lazy_image_read_ratio',
      help: "dsec_lazy_image_read_bytes_total over the image's size: the share of the image the edge's sandboxes needed.",
      labelNames: imageLabels,
      registers,
    });
    this.#batchItems = new Gauge({
      name: 'dsec_batch_items',
      help: 'Items of each running batch by state (count: all items; placed, running, failed so far).',
      labelNames: ['batch', 'state'] as const,
      registers,
    });
    this.#batches = new Gauge({ name: 'dsec_batches_running', help: 'Batches being driven by this control plane.', registers });
  }

  /** Reads the edges, the store and the batches and sets every gauge (labels of what went are dropped). */
  async refresh(): Promise<void> {
    const [edges, groups] = await Promise.all([this.view.edges(), this.view.sandboxCounts()]);
    const poolOf = new Map(edges.map((e) => [e.id, e.pool]));

    // The store's groups are by state, edge and project: each gauge sums over the label it lacks.
    this.#sandboxes.reset();
    this.#projectSandboxes.reset();
    for (const g of groups) {
      this.#sandboxes.inc({ state: g.status, pool: poolOf.get(g.edge) ?? 'unknown', edge: g.edge }, g.count);
      this.#projectSandboxes.inc({ project: g.project, state: g.status }, g.count);
    }

    this.#edges.reset();
    for (const g of Object.values(this.#edgeGauges)) g.reset();
    for (const c of Object.values(this.#edgeCounters)) c.reset();
    this.#imageRead.reset();
    this.#imageFetched.reset();
    this.#imageReadRatio.reset();
    const images = edges.some((e) => e.info.layerCache.lazy) ? this.view.images() : [];
    for (const e of edges) {
      const l = { edge: e.id, pool: e.pool };
      const cap = e.info.capacity;
      const cache = e.info.layerCache;
      const g = this.#edgeGauges;
      this.#edges.set({ ...l, state: e.state }, 1);
      g['sandboxes']!.set(l, e.info.sandboxes);
      g['maxSandboxes']!.set(l, e.info.maxSandboxes);
      g['utilisation']!.set(
        l,
        Math.max(e.info.sandboxes / Math.max(1, e.info.maxSandboxes), cap.memoryBytes ? 1 - cap.memoryAvailableBytes / cap.memoryBytes : 0),
      );
      g['cpus']!.set(l, cap.cpus);
      g['cpuCommitted']!.set(l, cap.cpuCommitted);
      if (cap.cpuUsage !== undefined) g['cpuUsage']!.set(l, cap.cpuUsage);
      g['memoryBytes']!.set(l, cap.memoryBytes);
      g['memoryAvailableBytes']!.set(l, cap.memoryAvailableBytes);
      g['memoryCommittedBytes']!.set(l, cap.memoryCommittedMiB * 1048576);
      g['pidsInUse']!.set(l, cap.pidsInUse);
      g['pidMax']!.set(l, cap.pidMax);
      g['cacheEntries']!.set(l, cache.entries);
      g['cacheBytes']!.set(l, cache.bytes);
      g['cacheChargedBytes']!.set(l, cache.chargedBytes);
      g['cacheBudgetBytes']!.set(l, cache.budgetBytes);
      const c = this.#edgeCounters;
      c['cacheHits']!.inc(l, cache.hits ?? 0);
      c['cacheMisses']!.inc(l, cache.misses ?? 0);
      c['cacheFetchedBytes']!.inc(l, cache.fetchedBytes ?? 0);
      c['cacheEvictions']!.inc(l, cache.evictions);
      if (cache.lazy) {
        g['lazyChunkBytes']!.set(l, cache.lazy.chunkBytes);
        c['lazyFetchedBytes']!.inc(l, cache.lazy.fetchedBytes);
        c['lazyEvictedChunks']!.inc(l, cache.lazy.evictedChunks);
        c['lazyFailedFetches']!.inc(
          l,
          cache.lazy.layers.reduce((n, x) => n + x.failedFetches, 0),
        );
        this.#setImageBytes(l, cache.lazy.layers, images);
      }
    }

    this.#batchItems.reset();
    const batches = this.view.batches();
    this.#batches.set(batches.length);
    for (const b of batches) {
      this.#batchItems.set({ batch: b.id, state: 'count' }, b.count);
      this.#batchItems.set({ batch: b.id, state: 'placed' }, b.placed);
      this.#batchItems.set({ batch: b.id, state: 'running' }, b.running);
      this.#batchItems.set({ batch: b.id, state: 'failed' }, b.failed);
    }
  }

  /** Per image with a layer on the edge's lazy store: its layers' read and fetched bytes summed, and the share read. */
  #setImageBytes(
    l: { edge: string; pool: string },
    layers: { digest: string; fetchedBytes: number; readBytes?: number | undefined }[],
    images: { id: string; names: string[]; layers: string[]; sizeBytes: number }[],
  ): void {
    const byDigest = new Map(layers.map((x) => [x.digest, x]));
    for (const img of images) {
      if (!img.layers.some((d) => byDigest.has(d))) continue;
      const sum = (f: (x: { fetchedBytes: number; readBytes?: number | undefined }) => number) =>
        img.layers.reduce((n, d) => n + (byDigest.has(d) ? f(byDigest.get(d)!) : 0), 0);
      const read = sum((x) => x.readBytes ?? 0);
      const labels = { ...l, image: img.id, name: img.names[0] ?? '' };
      this.#imageRead.inc(labels, read);
      this.#imageFetched.inc(
        labels,
        sum((x) => x.fetchedBytes),
      );
      if (img.sizeBytes > 0) this.#imageReadRatio.set(labels, read / img.sizeBytes);
    }
  }
}
