import type { ImageId } from '../image-store.js';
import type { LayerDigest } from '../layer-digest.js';
import { BuildCache } from './cache.js';
import { type DockerfileBuild, type StageImage, stateKey } from './build-state.js';
import { isImageNotFound } from './sandboxes.js';

/** Paths never captured in a build step's layer (dsec's own scratch). Package caches are kept, as Docker does. */
const BUILD_SCRUB = ['/tmp/.dsec'];
const RUNNER_LABEL = 'dsec.build.runner';

export const isRootUser = (user: string): boolean => /^0(:0)?$/.test(user.trim()) || user.trim() === '';

/** Puts an image for a state (the current one's by default); `asRoot` gives a variant whose processes run as root. */
function putRunner(b: DockerfileBuild, asRoot: boolean, s: StageImage = b.stage!): { id: ImageId; variant: boolean } {
  const variant = asRoot && !isRootUser(s.config.user);
  const config = variant ? { ...s.config, user: '0:0', labels: { ...s.config.labels, [RUNNER_LABEL]: 'root' } } : s.config;
  return { id: b.images.put({ layers: s.layers, config }), variant };
}

/** A sandbox of a state (the current one's by default), killed when `fn` is done. */
export async function withSandbox<T>(
  b: DockerfileBuild,
  asRoot: boolean,
  fn: (id: string) => Promise<T>,
  state: StageImage = b.stage!,
): Promise<T> {
  let runner = putRunner(b, asRoot, state);
  let id: string | undefined;
  for (let attempt = 0; ; attempt++) {
    try {
      id = await b.sandboxes.create(runner.id);
      break;
    } catch (err) {
      // Another build removed a shared runner variant between our put and create: put it again.
      if (!isImageNotFound(err) || attempt >= 3) throw err;
      runner = putRunner(b, asRoot, state);
    }
  }
  try {
    return await fn(id);
  } finally {
    await b.sandboxes.kill(id).catch((err: unknown) => b.warn(`could not kill build sandbox ${id}: ${(err as Error).message}`));
    if (runner.variant) b.images.remove(runner.id);
  }
}

/** A step that changes files: cached, or run in a sandbox and snapshotted into a layer. */
export async function sandboxStep(
  b: DockerfileBuild,
  key: string,
  ins: { original: string },
  asRoot: boolean,
  fn: (id: string) => Promise<void>,
): Promise<void> {
  const s = b.stage!;
  const { images, sandboxes, progress } = b;
  const hit = b.opts.noCache ? undefined : b.cache.get(key);
  if (hit) {
    s.layers = [...images.get(hit)!.layers];
    b.pendingWorkdir = false;
    b.cached++;
    progress(` ---> CACHED ${hit.slice(0, 19)}`);
    return;
  }
  const snap = await withSandbox(b, asRoot, async (id) => {
    progress(` ---> running in ${id}`);
    if (b.pendingWorkdir) await sandboxes.mkdir(id, s.config.cwd);
    await fn(id);
    return sandboxes.snapshot(id, BUILD_SCRUB);
  });
  s.layers = snap.layers as LayerDigest[];
  const result = images.put({ layers: s.layers, config: s.config });
  if (snap.imageId !== result && images.get(snap.imageId as ImageId)?.config.labels[RUNNER_LABEL]) images.remove(snap.imageId as ImageId);
  b.cache.set(key, result, ins.original);
  b.pendingWorkdir = false;
  b.executed++;
  if (snap.layerAdded) b.layersAdded++;
  progress(` ---> ${result.slice(0, 19)}${snap.layerAdded ? '' : ' (no changes: no layer added)'}`);
}

/** The image's working directory must exist: a sandbox of it starts commands there. */
export async function createPendingWorkdir(b: DockerfileBuild): Promise<void> {
  const s = b.stage!;
  b.progress(`Creating WORKDIR ${s.config.cwd}`);
  await sandboxStep(
    b,
    BuildCache.key([stateKey(s.layers, s.config), 'WORKDIR-create', s.config.cwd]),
    { original: `WORKDIR ${s.config.cwd} (create)` },
    true,
    async () => {},
  );
}
