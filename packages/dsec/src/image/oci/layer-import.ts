import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { writeFileAtomic } from '../atomic-file.js';
import { buildErofs, type ErofsBuildOptions } from '../erofs.js';
import type { ImageStore } from '../image-store.js';
import type { LayerDigest } from '../layer-digest.js';
import { openDecompressed } from './decompress.js';
import { ImportError, type ImportedLayer, type SourceImage } from './import-types.js';
import { mergeLayerInto } from './merge.js';
import { extractTarSafely, type ExtractStats } from './safe-extract.js';

// An imported image's layer tars become EROFS layers: each unpacked safely (overlay form) and
// checked against its diff_id, then packed, one by one or all merged into one (squash). The import
// cache (the image store's import-cache.json) maps diff_ids to the layer they became, so a layer
// imported before is not unpacked again.

const IMPORT_CACHE_VERSION = 1;

export interface ImportCache {
  version: number;
  layers: Record<string, LayerDigest>;
}

function cachePath(store: ImageStore): string {
  return join(store.dir, 'import-cache.json');
}

export function readCache(store: ImageStore): ImportCache {
  try {
    const c = JSON.parse(readFileSync(cachePath(store), 'utf8')) as ImportCache;
    if (c.version === IMPORT_CACHE_VERSION && c.layers && typeof c.layers === 'object') return c;
  } catch {
    // missing or unreadable: start over
  }
  return { version: IMPORT_CACHE_VERSION, layers: {} };
}

function cacheKey(kind: string, diffIds: string[], compression: string): string {
  return createHash('sha256')
    .update(JSON.stringify([IMPORT_CACHE_VERSION, kind, compression, diffIds]))
    .digest('hex');
}

/** Unpacks one layer blob into `tree` (overlay form) and checks its uncompressed digest. */
async function unpackLayer(layer: SourceImage['layers'][number], tree: string, warn: (m: string) => void): Promise<ExtractStats> {
  mkdirSync(tree, { recursive: true });
  const hash = createHash('sha256');
  const tap = async function* (): AsyncGenerator<Buffer> {
    for await (const chunk of openDecompressed(layer.file)) {
      hash.update(chunk);
      yield chunk;
    }
  };
  const stats = await extractTarSafely(tap(), tree, { layer: true, warn, label: layer.label });
  const actual = `sha256:${hash.digest('hex')}`;
  if (actual !== layer.diffId)
    throw new ImportError(`digest mismatch: ${layer.label} unpacks to sha256 ${actual} but the image config says ${layer.diffId}`);
  return stats;
}

function isEmpty(s: ExtractStats): boolean {
  return s.entries === 0 && s.whiteouts === 0 && s.opaqueDirs === 0;
}

/** Records the cache; a failure to write it costs a later import time, not this one its result. */
export function writeCache(store: ImageStore, cache: ImportCache, warn: (m: string) => void): void {
  try {
    writeFileAtomic(cachePath(store), JSON.stringify(cache, null, 2));
  } catch (err) {
    warn(`could not update the import cache: ${(err as Error).message}`);
  }
}

/** What an import's layer steps share. */
export interface LayerImport {
  store: ImageStore;
  /** Where layers are unpacked (removed by the caller). */
  scratch: string;
  cache: ImportCache;
  compression: NonNullable<ErofsBuildOptions['compression']>;
  progress: (message: string) => void;
  warn: (message: string) => void;
  onLayer?: (index: number, total: number) => void;
}

const zero = { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0 };

/** Every layer merged into one tree and packed as one EROFS layer, which every entry names. */
export async function importSquashed(src: SourceImage, x: LayerImport): Promise<ImportedLayer[]> {
  const { store, scratch, cache, compression, progress, warn } = x;
  const layers: ImportedLayer[] = [];
  const key = cacheKey(
    'squash',
    src.layers.map((l) => l.diffId),
    compression,
  );
  let digest = cache.layers[key];
  const cached = digest !== undefined && store.layers.has(digest);
  const totals = { ...zero };
  if (!cached) {
    const tree = join(scratch, 'squash');
    mkdirSync(tree);
    for (const [i, l] of src.layers.entries()) {
      x.onLayer?.(i, src.layers.length);
      progress(`  unpacking ${l.label} (${i + 1}/${src.layers.length})`);
      const layerTree = join(scratch, `layer-${i}`);
      const s = await unpackLayer(l, layerTree, warn);
      totals.entries += s.entries;
      totals.bytes += s.bytes;
      mergeLayerInto(tree, layerTree);
      rmSync(layerTree, { recursive: true, force: true });
    }
    progress('  packing the squashed tree with mkfs.erofs');
    const blob = store.layers.tempPath();
    await buildErofs(tree, blob, { compression });
    digest = await store.layers.add(blob);
    cache.layers[key] = digest;
  } else progress(`  reusing squashed layer ${digest!.slice(0, 19)} from an earlier import`);
  for (const l of src.layers) layers.push({ diffId: l.diffId, digest: digest!, cached, empty: false, ...totals });
  return layers;
}

/** One EROFS layer per layer tar: one imported before is reused, an empty one is left out. */
export async function importEachLayer(src: SourceImage, x: LayerImport): Promise<ImportedLayer[]> {
  const { store, scratch, cache, compression, progress, warn } = x;
  const layers: ImportedLayer[] = [];
  for (const [i, l] of src.layers.entries()) {
    x.onLayer?.(i, src.layers.length);
    const key = cacheKey('layer', [l.diffId], compression);
    const known = cache.layers[key];
    if (known && store.layers.has(known)) {
      progress(`  ${l.label}: already imported as ${known.slice(0, 19)}`);
      layers.push({ diffId: l.diffId, digest: known, cached: true, empty: false, ...zero });
      continue;
    }
    progress(`  unpacking ${l.label} (${i + 1}/${src.layers.length})`);
    const tree = join(scratch, `layer-${i}`);
    const s = await unpackLayer(l, tree, warn);
    if (isEmpty(s)) {
      rmSync(tree, { recursive: true, force: true });
      layers.push({ diffId: l.diffId, digest: '' as LayerDigest, cached: false, empty: true, ...zero });
      continue;
    }
    const blob = store.layers.tempPath();
    await buildErofs(tree, blob, { compression });
    rmSync(tree, { recursive: true, force: true });
    const digest = await store.layers.add(blob);
    cache.layers[key] = digest;
    layers.push({
      diffId: l.diffId,
      digest,
      cached: false,
      empty: false,
      entries: s.entries,
      bytes: s.bytes,
      whiteouts: s.whiteouts,
      opaqueDirs: s.opaqueDirs,
    });
  }
  return layers;
}
