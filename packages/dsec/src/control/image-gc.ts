import { readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageStore } from '../image/image-store.js';
import type { LayerDigest } from '../image/layer-store.js';
import { RegistryKeepsBlobsError, type ClusterRegistry } from './cluster/cluster-registry.js';
import type { StateStore } from './state-store.js';
import type { GcResult } from '@dsec/sdk/schema';

/** A blob this young may belong to a build or snapshot that has not registered its image yet. */
export const GC_GRACE_MS = 10 * 60_000;
/** Scratch dirs of builds, imports and snapshots: removed only when clearly abandoned. */
export const TEMP_GRACE_MS = 6 * 3600_000;

export type { GcResult } from '@dsec/sdk/schema';

/**
 * Deletes layer blobs that no image and no sandbox (running, paused or creating) refers to, and
 * build/snapshot scratch dirs left by a crash. Nothing in use is ever removed: a sandbox's
 * layers are in its state row from create to kill, and young blobs are spared. With a cluster
 * registry (the blob store of every replica), the blobs replicas recorded storing there are
 * deleted there too, whichever replica stored them; this replica's layer dir is only its cache.
 */
export async function collectGarbage(
  images: ImageStore,
  store: Pick<StateStore, 'sandboxes'>,
  now = Date.now(),
  graceMs = GC_GRACE_MS,
  registry?: Pick<ClusterRegistry, 'stored' | 'remove'>,
): Promise<GcResult> {
  await images.refresh(); // images made or deleted at other replicas count
  const keep = images.referencedLayers();
  for (const s of await store.sandboxes.list()) {
    if (s.status === 'running' || s.status === 'paused' || s.status === 'creating') for (const l of s.layers) keep.add(l as LayerDigest);
  }
  const result: GcResult = {
    removedLayers: [],
    freedBytes: 0,
    keptLayers: 0,
    keptInUse: 0,
    keptYoung: 0,
    keptYoungBytes: 0,
    graceSeconds: Math.round(graceMs / 1000),
    removedTemp: [],
  };
  const seen = new Set<LayerDigest>();
  if (registry) {
    result.keptByRegistry = 0;
    for (const blob of await registry.stored()) {
      seen.add(blob.digest);
      if (keep.has(blob.digest)) {
        result.keptLayers++;
        result.keptInUse++;
      } else if (now - blob.storedAt < graceMs) {
        result.keptLayers++;
        result.keptYoung++;
        result.keptYoungBytes += blob.sizeBytes;
      } else {
        try {
          result.freedBytes += await registry.remove(blob.digest);
          result.removedLayers.push(blob.digest);
        } catch (err) {
          if (!(err instanceof RegistryKeepsBlobsError)) throw err;
          result.keptByRegistry++;
        }
      }
    }
  }
  for (const digest of images.layers.list()) {
    if (seen.has(digest)) continue;
    if (keep.has(digest)) {
      result.keptLayers++;
      result.keptInUse++;
      continue;
    }
    if (images.layers.ageMs(digest) < graceMs) {
      result.keptLayers++;
      result.keptYoung++;
      result.keptYoungBytes += images.layers.size(digest);
      continue;
    }
    result.freedBytes += images.layers.remove(digest);
    result.removedLayers.push(digest);
  }
  for (const name of readdirSync(images.layers.tmpDir)) {
    const p = join(images.layers.tmpDir, name);
    if (now - statSync(p).mtimeMs > Math.max(graceMs, TEMP_GRACE_MS)) {
      rmSync(p, { recursive: true, force: true });
      result.removedTemp.push(name);
    }
  }
  return result;
}
