import { Type, type Static } from 'typebox';

/** One layer fetched lazily on this node: how much of it was read from the blob store. */
export const LazyLayerStat = Type.Object(
  {
    digest: Type.String({ description: 'The layer (sha256:<hex>).' }),
    sizeBytes: Type.Integer({ description: 'Size of the whole layer blob.' }),
    cachedBytes: Type.Integer({ description: "Bytes of the layer's chunks in the node's chunk cache now." }),
    fetchedBytes: Type.Integer({
      description: 'Bytes fetched from the blob store since the lazy layer daemon started (refetches after eviction included).',
    }),
    fetchedChunks: Type.Integer({ description: 'Chunks fetched since the daemon started.' }),
    readBytes: Type.Optional(
      Type.Integer({
        description:
          "Bytes of the layer's chunks read through the mount since the daemon started, each chunk once: what the node's workloads needed. Unlike fetchedBytes it does not count prefetched chunks nobody read, nor depend on whether the prefetcher or a reader fetched a chunk first.",
      }),
    ),
    readChunks: Type.Optional(Type.Integer({ description: 'Chunks read so.' })),
    prefetchedBytes: Type.Optional(
      Type.Integer({ description: "Bytes fetched ahead of any read, from the layer's access trace (counted in fetchedBytes too)." }),
    ),
    failedFetches: Type.Integer({ description: 'Chunk fetches that failed after every retry (the reader got EIO).' }),
    digestMismatches: Type.Integer({ description: 'Fetched chunks refused because their sha256 did not match the recorded list.' }),
    mounted: Type.Boolean({ description: 'Whether the layer is mounted now.' }),
  },
  {},
);
export type LazyLayerStat = Static<typeof LazyLayerStat>;

/** Chunks one sandbox read first on this node: those whose first reader on the node was one of its processes. */
export const LazySandboxStat = Type.Object(
  {
    id: Type.String({ description: 'The sandbox.' }),
    readBytes: Type.Optional(
      Type.Integer({
        description:
          'Bytes of the chunks a process of this sandbox read first on this node, whether they came on demand or were prefetched from the access trace.',
      }),
    ),
    readChunks: Type.Optional(Type.Integer({ description: 'Chunks read so.' })),
    fetchedBytes: Type.Integer({
      description:
        'Deprecated, kept for clients of earlier versions: the same as readBytes (before, a chunk the access trace prefetched first was charged to nobody).',
    }),
    fetchedChunks: Type.Integer({ description: 'Deprecated: the same as readChunks.' }),
  },
  {},
);
export type LazySandboxStat = Static<typeof LazySandboxStat>;

/** The node's lazy layer store (option layerFetch = lazy): dsec-chunk-fuse and its chunk cache. */
export const LazyLayerStats = Type.Object(
  {
    daemon: Type.Union([Type.Literal('running'), Type.Literal('stopped')], {
      description: 'Whether dsec-chunk-fuse runs (it starts on the first lazy layer).',
    }),
    chunkBytes: Type.Integer({ description: "Bytes in the node's chunk cache; counted in chargedBytes against the layer cache budget." }),
    fetchedBytes: Type.Integer({ description: 'Bytes fetched from the blob store, all layers.' }),
    evictedChunks: Type.Integer({ description: 'Chunks evicted to keep the layer cache within its budget since the edge started.' }),
    layers: Type.Array(LazyLayerStat),
    sandboxes: Type.Array(LazySandboxStat, {
      description:
        'Running sandboxes that read chunks first on the node; a chunk another sandbox read before costs a later sandbox nothing.',
    }),
  },
  {},
);
export type LazyLayerStats = Static<typeof LazyLayerStats>;

/** A node's layer cache: the local copies (or hard links) of the layer blobs it mounts. */
export const LayerCacheStats = Type.Object(
  {
    entries: Type.Integer({ description: 'Layers in the cache.' }),
    bytes: Type.Integer({ description: 'Size of every cached blob, linked or copied.' }),
    chargedBytes: Type.Integer({
      description:
        'Bytes counted against the budget: blobs the cache alone keeps on disk (copies, links whose store blob was deleted), and the chunk cache of lazily fetched layers. A hard link to a blob the store still holds costs nothing.',
    }),
    budgetBytes: Type.Integer({
      description: 'The budget (option layerCacheMiB); above it, least recently used unmounted layers are evicted.',
    }),
    mounted: Type.Integer({ description: 'Cached layers mounted now; a mounted layer is never evicted.' }),
    evictions: Type.Integer({ description: 'Layers evicted since the edge started.' }),
    hits: Type.Optional(
      Type.Integer({ description: 'Layers mounted (not mounted already) whose blob the cache held, since the edge started.' }),
    ),
    misses: Type.Optional(
      Type.Integer({ description: 'Layers mounted whose blob had to come into the cache first, since the edge started.' }),
    ),
    fetchedBytes: Type.Optional(
      Type.Integer({ description: 'Bytes copied or downloaded into the cache since the edge started (a hard link moves none).' }),
    ),
    overBudget: Type.Boolean({ description: 'True when the layers left (all mounted) alone exceed the budget.' }),
    lazy: Type.Optional(LazyLayerStats),
  },
  {},
);
export type LayerCacheStats = Static<typeof LayerCacheStats>;

export const NodeCapacity = Type.Object(
  {
    cpus: Type.Integer({ description: 'CPUs of the node.' }),
    memoryBytes: Type.Integer({ description: 'Memory of the node.' }),
    memoryAvailableBytes: Type.Integer({ description: 'MemAvailable at the last heartbeat.' }),
    cpuCommitted: Type.Number({ description: 'Sum of the cpu limits of its sandboxes.' }),
    memoryCommittedMiB: Type.Integer({ description: 'Sum of the memory limits of its sandboxes.' }),
    pidsCommitted: Type.Integer({ description: 'Sum of the pids limits of its sandboxes.' }),
    pidMax: Type.Integer({ description: 'kernel.pid_max of the node.' }),
    pidsInUse: Type.Integer({ description: 'Processes and threads on the node at the last heartbeat.' }),
    vms: Type.Optional(
      Type.Object(
        {
          slots: Type.Integer({ description: 'microVM/VM sandboxes the node takes at most (DSEC_MAX_VMS).' }),
          running: Type.Integer({ description: 'VM sandboxes on the node.' }),
          memoryCommittedMiB: Type.Integer({ description: 'Guest RAM plus QEMU overhead of its VMs.' }),
          overheadMiB: Type.Integer({ description: 'Host memory a VM takes beyond its guest RAM.' }),
        },
        { description: 'Present when the node runs microvm/vm sandboxes (its VM guest is built).' },
      ),
    ),
    cpuUsage: Type.Optional(Type.Number({ description: "Share of the node's CPU time busy between its last two measurements, 0..1." })),
  },
  { description: "What the node has, as its own edge measured it (never the control plane's host)." },
);

export const NodeInfo = Type.Object(
  {
    id: Type.String({ description: 'The edge id; part of every sandbox id on it.' }),
    url: Type.Optional(
      Type.String({ description: 'Where the control plane reaches the edge (absent for the in-process edge of dsec up).' }),
    ),
    pool: Type.String({ description: 'Node pool (placement.pool); "burst" takes burstable sandboxes above the burst threshold.' }),
    labels: Type.Record(Type.String(), Type.String()),
    state: Type.Union([Type.Literal('ready'), Type.Literal('draining'), Type.Literal('lost')], {
      description: 'ready: takes sandboxes; draining: takes none and leaves when empty; lost: no heartbeat within the timeout.',
    }),
    lastSeenAt: Type.String({ format: 'date-time', description: 'Last heartbeat.' }),
    version: Type.String({ description: 'dsec version of the edge.' }),
    sandboxes: Type.Integer({ description: 'Sandboxes on the node now.' }),
    maxSandboxes: Type.Integer({ description: 'Admission limit of the edge.' }),
    cpuOvercommit: Type.Number({ description: 'CPU limits may add up to this many times the CPUs (0: no cap).' }),
    utilisation: Type.Number({ description: 'The larger of sandbox slots and memory in use, 0..1.' }),
    capacity: NodeCapacity,
    cachedLayers: Type.Integer({ description: 'Layers in the node cache.' }),
    layerCache: LayerCacheStats,
  },
  {},
);
export type NodeInfo = Static<typeof NodeInfo>;

export const NodeList = Type.Object({ nodes: Type.Array(NodeInfo) }, {});
export type NodeList = Static<typeof NodeList>;

export const DrainRequest = Type.Object(
  {
    migrate: Type.Optional(
      Type.Boolean({
        description:
          'Move every sandbox that can move to other edges (POST /v1/sandboxes/{id}/migrate, each), and list the rest with why they stayed.',
      }),
    ),
    restartProcesses: Type.Optional(
      Type.Boolean({ description: "With migrate: end containers' running processes so they can move too (else such a container stays)." }),
    ),
  },
  { additionalProperties: false },
);
export type DrainRequest = Static<typeof DrainRequest>;

const DrainMoved = Type.Object({ id: Type.String(), to: Type.String(), ms: Type.Number() });
const DrainStayed = Type.Object({ id: Type.String(), code: Type.String(), reason: Type.String() });

export const DrainResult = Type.Object({
  node: NodeInfo,
  moved: Type.Array(DrainMoved, { description: 'Sandboxes moved off the edge, where to and how long each took.' }),
  stayed: Type.Array(DrainStayed, {
    description: 'Sandboxes left on the edge, with the code and reason their move was refused or failed.',
  }),
});
export type DrainResult = Static<typeof DrainResult>;

export const DrainProgress = Type.Union(
  [
    Type.Object({ type: Type.Literal('start'), total: Type.Integer({ description: 'Live sandboxes on the edge.' }) }),
    Type.Object({ type: Type.Literal('moved'), ...DrainMoved.properties }),
    Type.Object({ type: Type.Literal('stayed'), ...DrainStayed.properties }),
    Type.Object({ type: Type.Literal('done'), ...DrainResult.properties }),
  ],
  {
    description:
      'A line of a drain with migrate, streamed as NDJSON (Accept: application/x-ndjson): each sandbox as it moves or stays, then the result.',
  },
);
export type DrainProgress = Static<typeof DrainProgress>;
