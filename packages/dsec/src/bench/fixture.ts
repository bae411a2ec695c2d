import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import { compileOptions } from '../config/options.js';
import { LayerMounts } from '../edge/node/layer-mounts.js';
import { runToolOrThrow } from '../host/run-tool.js';
import { buildBusyboxImage } from '../image/builders/busybox.js';
import type { LayerDigest } from '../image/layer-store.js';
import { startAllInOne, type RunningDsec } from '../runtime/all-in-one.js';
import type { Cleanup } from './cleanup.js';
import type { RunNames } from './run-names.js';

export const BENCH_IMAGE = 'busybox';

/** What every peer of a run shares: one server, one image, one layer. */
export interface BenchFixture {
  names: RunNames;
  dir: string;
  dsec: RunningDsec;
  layer: LayerDigest;
  config: ImageConfig;
  /** The busybox EROFS layer, mounted once for raw crun's overlays and the podman/docker tar. */
  lowerDir: string;
  /** A tar of that tree (made on first use) for `podman import` / `docker import`. */
  rootfsTar(): Promise<string>;
}

/**
 * Starts dsec in this process (control plane + edge + HTTP on 127.0.0.1:<free port>) on its own
 * data dir under the run's temp dir, builds the busybox image into it, and mounts its layer.
 * Every step registers its undo with `cleanup`.
 */
export async function startFixture(
  names: RunNames,
  maxSandboxes: number,
  cleanup: Cleanup,
  say: (m: string) => void,
): Promise<BenchFixture> {
  const { dir } = names;
  // Flags only: DSEC_* variables of the caller's shell must not point the benchmark elsewhere.
  const options = compileOptions(
    { dataDir: join(dir, 'dsec'), listen: '127.0.0.1:0', logLevel: 'silent', edgeId: names.edgeId, maxSandboxes },
    {},
  );
  const dsec = await startAllInOne(options);
  cleanup.add('stop the in-process dsec and kill its sandboxes', () => dsec.close({ killAll: true }));
  for (const c of dsec.doctor) if (c.fixed) say(`doctor: ${c.fixed}`);
  await buildBusyboxImage(dsec.images, { name: BENCH_IMAGE, progress: (m) => say(`  ${m}`) });
  const id = dsec.images.resolve(BENCH_IMAGE);
  const manifest = id && dsec.images.get(id);
  const layer = manifest?.layers[0];
  if (!manifest || !layer || manifest.layers.length !== 1) throw new Error('the busybox image should have exactly one layer');

  const mounts = new LayerMounts(join(dir, 'peer-layers'), dsec.images.layers);
  const lowerDir = await mounts.acquire(layer);
  cleanup.add("unmount the peers' busybox layer", () => mounts.release(layer));

  let tar: Promise<string> | undefined;
  return {
    names,
    dir,
    dsec,
    layer,
    config: manifest.config,
    lowerDir,
    rootfsTar() {
      tar ??= (async () => {
        const file = join(dir, 'busybox-rootfs.tar');
        await runToolOrThrow('tar', ['--numeric-owner', '-C', lowerDir, '-cf', file, '.']);
        return file;
      })();
      return tar;
    },
  };
}
