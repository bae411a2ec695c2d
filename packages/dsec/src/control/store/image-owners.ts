import type { SqlDb } from './sql.js';

/**
 * Image ownership: an image id or name with rows here is private to those projects
 * (control/project-images.ts decides with them).
 */
export interface ImageOwnerRecords {
  /** The projects an image id is private to; none: shared. */
  projects(imageId: string): Promise<string[]>;
  add(imageId: string, project: string): Promise<void>;
  remove(imageId: string, project: string): Promise<void>;
  removeAll(imageId: string): Promise<void>;
  /** The project an image name is private to; undefined: shared (or unused). */
  nameOwner(name: string): Promise<string | undefined>;
  /**
   * nameOwner(name) and projects(imageId) in one read: what a create checks, and on PostgreSQL
   * every read is a round trip.
   */
  owners(name: string | undefined, imageId: string): Promise<{ nameOwner: string | undefined; idOwners: string[] }>;
  /** The first owner of a name stays. */
  setNameOwner(name: string, project: string): Promise<void>;
  removeNameOwner(name: string): Promise<void>;
}

export class SqlImageOwnerRecords implements ImageOwnerRecords {
  constructor(private readonly db: SqlDb) {}

  async projects(imageId: string): Promise<string[]> {
    return (await this.db.all<{ project: string }>('SELECT project FROM image_owners WHERE image_id = ?', [imageId])).map((r) => r.project);
  }

  async add(imageId: string, project: string): Promise<void> {
    await this.db.run('INSERT INTO image_owners (image_id, project) VALUES (?, ?) ON CONFLICT (image_id, project) DO NOTHING', [
      imageId,
      project,
    ]);
  }

  async remove(imageId: string, project: string): Promise<void> {
    await this.db.run('DELETE FROM image_owners WHERE image_id = ? AND project = ?', [imageId, project]);
  }

  async removeAll(imageId: string): Promise<void> {
    await this.db.run('DELETE FROM image_owners WHERE image_id = ?', [imageId]);
  }

  async nameOwner(name: string): Promise<string | undefined> {
    return (await this.db.get<{ project: string }>('SELECT project FROM image_name_owners WHERE name = ?', [name]))?.project;
  }

  async owners(name: string | undefined, imageId: string): Promise<{ nameOwner: string | undefined; idOwners: string[] }> {
    const rows = await this.db.all<{ kind: string; project: string }>(
      "SELECT 'name' AS kind, project FROM image_name_owners WHERE name = ? UNION ALL SELECT 'id' AS kind, project FROM image_owners WHERE image_id = ?",
      // No image name is empty: an id alone matches no name row.
      [name ?? '', imageId],
    );
    return { nameOwner: rows.find((r) => r.kind === 'name')?.project, idOwners: rows.filter((r) => r.kind === 'id').map((r) => r.project) };
  }

  async setNameOwner(name: string, project: string): Promise<void> {
    await this.db.run('INSERT INTO image_name_owners (name, project) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [name, project]);
  }

  async removeNameOwner(name: string): Promise<void> {
    await this.db.run('DELETE FROM image_name_owners WHERE name = ?', [name]);
  }
}
