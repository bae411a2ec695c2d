import { mkdirSync } from 'node:fs';
import { ApiError } from '../api-error.js';
import { MS_NODEV, mount } from '../host/syscalls.js';

/** mount(2) takes the option string in one page. */
const MAX_OPTIONS = 4095;

/**
 * Stacks read-only layers (bottom first) under a sandbox's writable upper dir. The layers are the
 * node's shared EROFS mounts: composition copies no layer data.
 */
export function mountOverlay(layersBottomFirst: string[], upper: string, work: string, target: string): void {
  for (const d of [upper, work, target]) mkdirSync(d, { recursive: true });
  const lowerdir = [...layersBottomFirst].reverse().join(':');
  const options = `lowerdir=${lowerdir},upperdir=${upper},workdir=${work}`;
  if (options.length > MAX_OPTIONS) {
    throw new ApiError('INVALID_REQUEST', `too many layers (${layersBottomFirst.length}) for one overlay mount`, { layers: layersBottomFirst.length });
  }
  mount('overlay', target, 'overlay', MS_NODEV, options);
}
