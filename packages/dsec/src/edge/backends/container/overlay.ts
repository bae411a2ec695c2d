import { mkdirSync } from 'node:fs';
import { ApiError } from '../../../api-error.js';
import { MAX_OVERLAY_LAYERS, mountOverlayByFd } from '../../../host/mount-api.js';

/**
 * Stacks read-only layers (bottom first) under a sandbox's writable upper dir. The layers are the
 * node's shared EROFS mounts: composition copies no layer data. They are handed to overlayfs as
 * file descriptors (host/mount-api.ts), so the sandbox's mountinfo names no host path or layer
 * digest; `usernsFd` id-maps each layer for a sandbox in a user namespace (edge/idmapped-root.ts).
 */
export function mountOverlay(layersBottomFirst: string[], upper: string, work: string, target: string, usernsFd?: number): void {
  for (const d of [upper, work, target]) mkdirSync(d, { recursive: true });
  if (layersBottomFirst.length > MAX_OVERLAY_LAYERS) {
    throw new ApiError(
      'INVALID_REQUEST',
      `too many layers (${layersBottomFirst.length}) for one overlay mount: at most ${MAX_OVERLAY_LAYERS}`,
      { layers: layersBottomFirst.length },
    );
  }
  // No redirects or metacopy: an upper dir must be a self-contained diff that pack_diff can turn
  // into a layer (a renamed lower directory is copied up whole instead of pointing back at it).
  // nosuid,nodev (mountOverlayByFd): a setuid file or a device node the sandbox makes in its
  // writable layer stays inert wherever the overlay is reached from (crun also reaches it here).
  mountOverlayByFd({
    lowersTopFirst: [...layersBottomFirst].reverse(),
    upper,
    work,
    target,
    ...(usernsFd !== undefined ? { usernsFd } : {}),
    options: { redirect_dir: 'off', metacopy: 'off' },
  });
}
