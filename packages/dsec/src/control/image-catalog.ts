import type { ImageCatalog, ImageCatalogSnapshot, ImageChange, ImageId, ImageManifest } from '../image/image-store.js';
import type { Sql } from './store/sql.js';
import type { StateStore } from './state-store.js';

/**
 * Image records in the state store (migration 7): `images` (id → manifest JSON), `image_names`,
 * `image_builds`, and `image_catalog.version`, bumped in the transaction of every change so a
 * replica reads everything again only when something changed. Deleting an image or a name leaves
 * a tombstone, so a replica that still has it as a file (it was down meanwhile) does not bring it
 * back when it imports its files; putting or naming it again clears the tombstone.
 */
export class StoreImageCatalog implements ImageCatalog {
  constructor(private readonly store: StateStore) {}

  async version(): Promise<number> {
    return Number((await this.store.db.get<{ version: number | string }>('SELECT version FROM image_catalog WHERE one = 1'))?.version ?? 0);
  }

  async load(): Promise<ImageCatalogSnapshot> {
    return this.store.db.transaction(async (tx) => {
      const version = Number((await tx.get<{ version: number | string }>('SELECT version FROM image_catalog WHERE one = 1'))?.version ?? 0);
      const images = await tx.all<{ id: ImageId; manifest: string }>('SELECT id, manifest FROM images ORDER BY created_at, id');
      const names = await tx.all<{ name: string; image_id: ImageId }>('SELECT name, image_id FROM image_names ORDER BY name');
      const builds = await tx.all<{ cache_key: string; image_id: ImageId }>(
        'SELECT cache_key, image_id FROM image_builds ORDER BY cache_key',
      );
      return {
        version,
        images: images.map((r) => [r.id, JSON.parse(r.manifest) as ImageManifest]),
        names: names.map((r) => [r.name, r.image_id]),
        builds: builds.map((r) => [r.cache_key, r.image_id]),
      };
    });
  }

  async apply(changes: ImageChange[]): Promise<void> {
    await this.store.db.transaction(async (tx) => {
      let changed = false;
      for (const c of changes) changed = (await applyOne(tx, c)) || changed;
      if (changed) await tx.run('UPDATE image_catalog SET version = version + 1 WHERE one = 1');
    });
  }
}

/**
 * Whether the entry was deleted after `writtenAt` (when a file of it was written; without it,
 * whether it was ever deleted): a file from before the delete is a stale copy, one written after
 * it is new. A tombstone a newer file outlived is cleared.
 */
async function tombstoned(tx: Sql, kind: string, entry: string, writtenAt?: string): Promise<boolean> {
  const row = await tx.get<{ removed_at: string }>('SELECT removed_at FROM image_tombstones WHERE kind = ? AND entry = ?', [kind, entry]);
  if (!row) return false;
  if (writtenAt === undefined || writtenAt <= row.removed_at) return true;
  await clearTombstone(tx, kind, entry);
  return false;
}

async function clearTombstone(tx: Sql, kind: string, entry: string): Promise<void> {
  await tx.run('DELETE FROM image_tombstones WHERE kind = ? AND entry = ?', [kind, entry]);
}

async function bury(tx: Sql, kind: string, entry: string): Promise<void> {
  await tx.run('INSERT INTO image_tombstones (kind, entry, removed_at) VALUES (?, ?, ?) ON CONFLICT (kind, entry) DO NOTHING', [
    kind,
    entry,
    new Date().toISOString(),
  ]);
}

/** One change; true when it changed a row. */
async function applyOne(tx: Sql, c: ImageChange): Promise<boolean> {
  switch (c.op) {
    case 'put': {
      if (c.imported && (await tombstoned(tx, 'image', c.id, c.writtenAt))) return false;
      if (!c.imported) await clearTombstone(tx, 'image', c.id);
      const { changes } = await tx.run('INSERT INTO images (id, manifest, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING', [
        c.id,
        JSON.stringify(c.manifest),
        c.manifest.createdAt,
      ]);
      return changes === 1;
    }
    case 'tag': {
      if (c.imported) {
        if (await tombstoned(tx, 'name', c.name, c.writtenAt)) return false;
        return (
          (await tx.run('INSERT INTO image_names (name, image_id) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [c.name, c.id])).changes ===
          1
        );
      }
      await clearTombstone(tx, 'name', c.name);
      await tx.run('INSERT INTO image_names (name, image_id) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET image_id = excluded.image_id', [
        c.name,
        c.id,
      ]);
      return true;
    }
    case 'untag': {
      await bury(tx, 'name', c.name);
      return (await tx.run('DELETE FROM image_names WHERE name = ?', [c.name])).changes > 0;
    }
    case 'remove': {
      await bury(tx, 'image', c.id);
      for (const r of await tx.all<{ name: string }>('SELECT name FROM image_names WHERE image_id = ?', [c.id]))
        await bury(tx, 'name', r.name);
      await tx.run('DELETE FROM image_names WHERE image_id = ?', [c.id]);
      await tx.run('DELETE FROM image_builds WHERE image_id = ?', [c.id]);
      return (await tx.run('DELETE FROM images WHERE id = ?', [c.id])).changes > 0;
    }
    case 'build': {
      if (c.imported)
        return (
          (await tx.run('INSERT INTO image_builds (cache_key, image_id) VALUES (?, ?) ON CONFLICT (cache_key) DO NOTHING', [c.key, c.id]))
            .changes === 1
        );
      await tx.run(
        'INSERT INTO image_builds (cache_key, image_id) VALUES (?, ?) ON CONFLICT (cache_key) DO UPDATE SET image_id = excluded.image_id',
        [c.key, c.id],
      );
      return true;
    }
  }
}
