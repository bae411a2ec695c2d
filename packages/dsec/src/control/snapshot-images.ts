import type { SandboxInfo } from '@dsec/sdk/schema';
import type { ImageId, ImageStore } from '../image/image-store.js';
import type { StateStore } from './state-store.js';

/**
 * The lifetime of snapshot images. A snapshot that is neither named nor kept belongs to its
 * sandbox: it is deleted once that sandbox and every sandbox started from the image (forks,
 * restores) are gone, so thousands of rollouts do not leave thousands of images behind. A name
 * given later keeps it too. The layers themselves are freed by `image gc`.
 */
export class SnapshotImages {
  #tableMade = false;

  constructor(
    private readonly store: StateStore,
    private readonly images: ImageStore,
  ) {}

  /** The store's database, with this table made at first use (the constructor touches nothing). */
  get #db(): StateStore['db'] {
    if (!this.#tableMade) {
      this.store.db.exec(`CREATE TABLE IF NOT EXISTS snapshot_images (
        image_id TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL
      );
      CREATE INDEX IF NOT EXISTS snapshot_images_sandbox ON snapshot_images(sandbox_id);`);
      this.#tableMade = true;
    }
    return this.store.db;
  }

  /** Ties an unnamed, unkept snapshot image to the sandbox it was taken of. */
  own(imageId: ImageId, sandboxId: string): void {
    this.#db.prepare('INSERT OR IGNORE INTO snapshot_images (image_id, sandbox_id) VALUES (?, ?)').run(imageId, sandboxId);
  }

  /** The sandbox an image goes away with, if it is an ephemeral snapshot. */
  ownerOf(imageId: string): string | undefined {
    return (this.#db.prepare('SELECT sandbox_id FROM snapshot_images WHERE image_id = ?').get(imageId) as { sandbox_id: string } | undefined)?.sandbox_id;
  }

  #forget(imageId: string): void {
    this.#db.prepare('DELETE FROM snapshot_images WHERE image_id = ?').run(imageId);
  }

  /**
   * After `gone` was removed from the state store: deletes its snapshot images, and the image it
   * ran from when that was someone's snapshot, unless a live record still uses one or it was
   * named since. Returns the images deleted.
   */
  release(gone: SandboxInfo): string[] {
    const owned = (this.#db.prepare('SELECT image_id FROM snapshot_images WHERE sandbox_id = ?').all(gone.id) as { image_id: string }[]).map((r) => r.image_id);
    const deleted: string[] = [];
    for (const imageId of new Set([...owned, gone.imageId])) {
      const owner = this.ownerOf(imageId);
      if (owner === undefined || this.store.getSandbox(owner)) continue;
      const info = this.images.info(imageId as ImageId);
      if (!info || info.names.length > 0) {
        this.#forget(imageId); // deleted by hand, or named since: no longer ours to delete
        continue;
      }
      if (this.#db.prepare('SELECT 1 FROM sandboxes WHERE image_id = ? LIMIT 1').get(imageId)) continue;
      this.images.remove(imageId as ImageId);
      this.#forget(imageId);
      deleted.push(imageId);
    }
    return deleted;
  }
}
