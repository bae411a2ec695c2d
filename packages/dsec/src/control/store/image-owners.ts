import { announceChange, type ChangeFeed } from './change-feed.js';
import type { MaybePromise } from '../../maybe-promise.js';
import { ReadCache } from './read-cache.js';
import type { Sql, SqlDb } from './sql.js';

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
   * every read is a round trip. At once when kept in memory (read-cache.ts).
   */
  owners(name: string | undefined, imageId: string): MaybePromise<{ nameOwner: string | undefined; idOwners: string[] }>;
  /** The first owner of a name stays. */
  setNameOwner(name: string, project: string): Promise<void>;
  removeNameOwner(name: string): Promise<void>;
}

/** Image refs a replica keeps the owners of at most, and how long with no word from the change feed. */
const CACHED_REFS = 10_000;
const OWNERS_TTL_MS = 10_000;

type Owners = { nameOwner: string | undefined; idOwners: string[] };

export class SqlImageOwnerRecords implements ImageOwnerRecords {
  /**
   * owners() by name and id, shared images (no owner) included: every create reads them, and on
   * PostgreSQL that read was a round trip of its own per create, the one a turn's creates did not
   * share (2,000 of ~4,700 statements of the replicas bench's 2,000 creates). A change by any
   * replica empties it through the change feed, in the changing transaction.
   */
  readonly #owners: ReadCache<Owners>;

  constructor(
    private readonly db: SqlDb,
    feed?: ChangeFeed,
  ) {
    this.#owners = new ReadCache(feed, 'image_owners', { ttlMs: OWNERS_TTL_MS, maxEntries: CACHED_REFS });
  }

  async projects(imageId: string): Promise<string[]> {
    return (await this.db.all<{ project: string }>('SELECT project FROM image_owners WHERE image_id = ?', [imageId])).map((r) => r.project);
  }

  async add(imageId: string, project: string): Promise<void> {
    await this.#changing((tx) =>
      tx.run('INSERT INTO image_owners (image_id, project) VALUES (?, ?) ON CONFLICT (image_id, project) DO NOTHING', [imageId, project]),
    );
  }

  async remove(imageId: string, project: string): Promise<void> {
    await this.#changing((tx) => tx.run('DELETE FROM image_owners WHERE image_id = ? AND project = ?', [imageId, project]));
  }

  async removeAll(imageId: string): Promise<void> {
    await this.#changing((tx) => tx.run('DELETE FROM image_owners WHERE image_id = ?', [imageId]));
  }

  async nameOwner(name: string): Promise<string | undefined> {
    return (await this.db.get<{ project: string }>('SELECT project FROM image_name_owners WHERE name = ?', [name]))?.project;
  }

  owners(name: string | undefined, imageId: string): MaybePromise<Owners> {
    // No image name is empty (nor holds a NUL): an id alone matches no name row.
    return this.#owners.get(`${name ?? ''}\0${imageId}`, async () => {
      const rows = await this.db.all<{ kind: string; project: string }>(
        "SELECT 'name' AS kind, project FROM image_name_owners WHERE name = ? UNION ALL SELECT 'id' AS kind, project FROM image_owners WHERE image_id = ?",
        [name ?? '', imageId],
      );
      return {
        nameOwner: rows.find((r) => r.kind === 'name')?.project,
        idOwners: rows.filter((r) => r.kind === 'id').map((r) => r.project),
      };
    });
  }

  async setNameOwner(name: string, project: string): Promise<void> {
    await this.#changing((tx) =>
      tx.run('INSERT INTO image_name_owners (name, project) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [name, project]),
    );
  }

  async removeNameOwner(name: string): Promise<void> {
    await this.#changing((tx) => tx.run('DELETE FROM image_name_owners WHERE name = ?', [name]));
  }

  /** A change of owner rows, announced to every replica with it and forgotten here at once. */
  async #changing(change: (tx: Sql) => Promise<unknown>): Promise<void> {
    await this.db.transaction(async (tx) => {
      await change(tx);
      await announceChange(tx, this.#owners.topic);
    });
    this.#owners.invalidate();
  }
}
