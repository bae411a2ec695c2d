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
  constructor(
    private readonly store: StateStore,
    private readonly images: ImageStore,
  ) {}

  /** Ties an unnamed, unkept snapshot image to the sandbox it was taken of. */
  async own(imageId: ImageId, sandboxId: string): Promise<void> {
    await this.store.db.run('INSERT INTO snapshot_images (image_id, sandbox_id) VALUES (?, ?) ON CONFLICT DO NOTHING', [
      imageId,
      sandboxId,
    ]);
  }

  /** The sandbox an image goes away with, if it is an ephemeral snapshot. */
  async ownerOf(imageId: string): Promise<string | undefined> {
    return (await this.store.db.get<{ sandbox_id: string }>('SELECT sandbox_id FROM snapshot_images WHERE image_id = ?', [imageId]))
      ?.sandbox_id;
  }

  async #forget(imageId: string): Promise<void> {
    await this.store.db.run('DELETE FROM snapshot_images WHERE image_id = ?', [imageId]);
  }

  /**
   * After `gone` was removed from the state store: deletes its snapshot images, and the image it
   * ran from when that was someone's snapshot, unless a live record still uses one or it was
   * named since. Returns the images deleted.
   */
  async release(gone: SandboxInfo): Promise<string[]> {
    const owned = (
      await this.store.db.all<{ image_id: string }>('SELECT image_id FROM snapshot_images WHERE sandbox_id = ?', [gone.id])
    ).map((r) => r.image_id);
    const deleted: string[] = [];
    for (const imageId of new Set([...owned, gone.imageId])) {
      const owner = await this.ownerOf(imageId);
      if (owner === undefined || (await this.store.sandboxes.get(owner))) continue;
      const info = this.images.info(imageId as ImageId);
      if (!info || info.names.length > 0) {
        await this.#forget(imageId); // deleted by hand, or named since: no longer ours to delete
        continue;
      }
      if (await this.store.db.get('SELECT 1 AS one FROM sandboxes WHERE image_id = ? LIMIT 1', [imageId])) continue;
      this.images.remove(imageId as ImageId);
      await this.#forget(imageId);
      deleted.push(imageId);
    }
    return deleted;
  }
}
