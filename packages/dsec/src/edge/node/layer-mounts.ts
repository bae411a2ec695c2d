import { mkdirSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { MS_NODEV, MS_NOSUID, MS_RDONLY, SyscallError, mount, umount, MNT_DETACH } from '../../host/syscalls.js';
import { mountsUnder } from '../../host/mounts.js';
import { runToolOrThrow } from '../../host/run-tool.js';
import { LayerStore, type LayerDigest } from '../../image/layer-store.js';

/** Where the blob to mount comes from: the node's LayerCache, or a LayerStore used directly. */
export interface LayerBlobs {
  /** A local path to the blob, ready to mount. */
  ensure(digest: LayerDigest): Promise<string>;
  /** The layer's last mount is gone. */
  unmounted(digest: LayerDigest): void;
}

/**
 * The node's shared, read-only layer mounts: each EROFS blob (from the node's layer cache) is mounted once under
 * `node/layers/<hex>` and shared by every sandbox that stacks it; a refcount unmounts it when the
 * last user goes. Mounting uses mount(2) on the blob file (file-backed EROFS, ~0.5 ms, no loop
 * device). Where the kernel refuses that (ENOTBLK: the blob lives on overlayfs), it falls back to
 * mount(8), which attaches a loop device.
 */
export class LayerMounts {
  readonly #refs = new Map<LayerDigest, number>();
  readonly #pending = new Map<LayerDigest, Promise<string>>();
  readonly dir: string;
  readonly #blobs: LayerBlobs;

  /** A LayerStore given directly is mounted from in place (the benchmark's raw-crun peers do so). */
  constructor(nodeDir: string, blobs: LayerBlobs | LayerStore) {
    this.dir = join(nodeDir, 'layers');
    mkdirSync(this.dir, { recursive: true });
    this.#blobs = blobs instanceof LayerStore ? { ensure: async (d) => blobs.path(d), unmounted: () => undefined } : blobs;
  }

  mountPoint(digest: LayerDigest): string {
    return join(this.dir, digest.slice('sha256:'.length));
  }

  /** Mounts the layer if needed and takes a reference; returns its mount point. */
  async acquire(digest: LayerDigest): Promise<string> {
    const n = this.#refs.get(digest) ?? 0;
    if (n > 0) {
      this.#refs.set(digest, n + 1);
      return this.mountPoint(digest);
    }
    // Concurrent first users wait on one mount.
    let pending = this.#pending.get(digest);
    if (!pending) {
      pending = this.#mount(digest).finally(() => this.#pending.delete(digest));
      this.#pending.set(digest, pending);
    }
    const mp = await pending;
    this.#refs.set(digest, (this.#refs.get(digest) ?? 0) + 1);
    return mp;
  }

  /** Drops a reference; the last one unmounts. */
  release(digest: LayerDigest): void {
    const n = (this.#refs.get(digest) ?? 0) - 1;
    if (n > 0) {
      this.#refs.set(digest, n);
      return;
    }
    this.#refs.delete(digest);
    this.#unmount(digest);
  }

  /** After a restart: count references of adopted sandboxes, unmount every other layer mount. */
  reconcile(inUse: LayerDigest[][]): void {
    for (const layers of inUse) for (const d of layers) this.#refs.set(d, (this.#refs.get(d) ?? 0) + 1);
    const wanted = new Set([...this.#refs.keys()].map((d) => this.mountPoint(d)));
    for (const m of mountsUnder(this.dir).reverse()) {
      if (m.mountPoint !== this.dir && !wanted.has(m.mountPoint)) {
        tryUnmount(m.mountPoint);
        try {
          rmdirSync(m.mountPoint);
        } catch {
          // still busy or already gone
        }
      }
    }
  }

  refCount(digest: LayerDigest): number {
    return this.#refs.get(digest) ?? 0;
  }

  /** Mounted, or being mounted right now. */
  inUse(digest: LayerDigest): boolean {
    return this.#refs.has(digest) || this.#pending.has(digest);
  }

  mounted(): LayerDigest[] {
    return [...this.#refs.keys()];
  }

  async #mount(digest: LayerDigest): Promise<string> {
    const mp = this.mountPoint(digest);
    if (mountsUnder(mp).some((m) => m.mountPoint === mp)) return mp; // survived an edge restart
    const blob = await this.#blobs.ensure(digest);
    mkdirSync(mp, { recursive: true });
    try {
      mount(blob, mp, 'erofs', MS_RDONLY | MS_NOSUID | MS_NODEV, null);
    } catch (err) {
      if (!(err instanceof SyscallError && err.code === 'ENOTBLK')) throw err;
      await runToolOrThrow('mount', ['-t', 'erofs', '-o', 'ro,loop,nosuid,nodev', blob, mp]);
    }
    return mp;
  }

  #unmount(digest: LayerDigest): void {
    const mp = this.mountPoint(digest);
    tryUnmount(mp);
    try {
      rmdirSync(mp);
    } catch {
      // a lazy unmount may still hold it; reconcile retries at next start
    }
    this.#blobs.unmounted(digest);
  }
}

/** Unmounts; a busy mount is detached lazily so it disappears once its last user does. */
export function tryUnmount(mp: string): void {
  try {
    umount(mp);
  } catch (err) {
    if (err instanceof SyscallError && (err.code === 'EINVAL' || err.code === 'ENOENT')) return;
    try {
      umount(mp, MNT_DETACH);
    } catch {
      // not mounted
    }
  }
}
