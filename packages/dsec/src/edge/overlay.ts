import { mkdirSync } from 'node:fs';
import { ApiError } from '../api-error.js';
import { MS_NODEV, MS_NOSUID, mount } from '../host/syscalls.js';

/** mount(2) takes the option string in one page. */
const MAX_OPTIONS = 4095;

/**
 * Stacks read-only layers (bottom first) under a sandbox's writable upper dir. The layers are the
 * node's shared EROFS mounts: composition copies no layer data.
 */
export function mountOverlay(layersBottomFirst: string[], upper: string, work: string, target: string): void {
  for (const d of [upper, work, target]) mkdirSync(d, { recursive: true });
  const lowerdir = [...layersBottomFirst].reverse().join(':');
  // No redirects or metacopy: an upper dir must be a self-contained diff that pack_diff can turn
  // into a layer (a renamed lower directory is copied up whole instead of pointing back at it).
  const options = `lowerdir=${lowerdir},upperdir=${upper},workdir=${work},redirect_dir=off,metacopy=off`;
  if (options.length > MAX_OPTIONS) {
    throw new ApiError('INVALID_REQUEST', `too many layers (${layersBottomFirst.length}) for one overlay mount`, { layers: layersBottomFirst.length });
  }
  // nosuid,nodev: a setuid file or a device node the sandbox makes in its writable layer stays
  // inert wherever the overlay is reached from (crun also reaches it through this mount).
  mount('overlay', target, 'overlay', MS_NODEV | MS_NOSUID, options);
}
