import { Type, type Static } from 'typebox';

/** A node's layer cache: the local copies (or hard links) of the layer blobs it mounts. */
export const LayerCacheStats = Type.Object(
  {
    entries: Type.Integer({ description: 'Layers in the cache.' }),
    bytes: Type.Integer({ description: 'Size of every cached blob, linked or copied.' }),
    chargedBytes: Type.Integer({
      description:
        'Bytes counted against the budget: blobs the cache alone keeps on disk (copies, links whose store blob was deleted). A hard link to a blob the store still holds costs nothing.',
    }),
    budgetBytes: Type.Integer({
      description: 'The budget (option layerCacheMiB); above it, least recently used unmounted layers are evicted.',
    }),
    mounted: Type.Integer({ description: 'Cached layers mounted now; a mounted layer is never evicted.' }),
    evictions: Type.Integer({ description: 'Layers evicted since the edge started.' }),
    overBudget: Type.Boolean({ description: 'True when the layers left (all mounted) alone exceed the budget.' }),
  },
  {},
);
export type LayerCacheStats = Static<typeof LayerCacheStats>;

export const NodeInfo = Type.Object(
  {
    id: Type.String({ description: 'The edge id; part of every sandbox id on it.' }),
    sandboxes: Type.Integer({ description: 'Sandboxes on the node now.' }),
    maxSandboxes: Type.Integer({ description: 'Admission limit of the edge.' }),
    layerCache: LayerCacheStats,
  },
  {},
);
export type NodeInfo = Static<typeof NodeInfo>;

export const NodeList = Type.Object({ nodes: Type.Array(NodeInfo) }, {});
export type NodeList = Static<typeof NodeList>;
