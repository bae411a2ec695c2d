import { migrate } from './store/migrations.js';
import type { SqlDb } from './store/sql.js';
import { PostgresDb } from './store/postgres-db.js';
import { PostgresChangeFeed, SqliteChangeFeed, type ChangeFeed, type RequestArrivals } from './store/change-feed.js';
import { SqliteDb } from './store/sqlite-db.js';
import { type KeyRecords, SqlKeyRecords } from './store/api-keys.js';
import { type BatchRecords, SqlBatchRecords } from './store/batches.js';
import { type EdgeRecords, SqlEdgeRecords } from './store/edges.js';
import { type ImageOwnerRecords, SqlImageOwnerRecords } from './store/image-owners.js';
import { type LeaseRecords, SqlLeaseRecords } from './store/leases.js';
import { type PoolRecords, SqlPoolRecords } from './store/pools.js';
import { type ProjectRecords, SqlProjectRecords } from './store/projects.js';
import { type SandboxMoveRecords, SqlSandboxMoveRecords } from './store/sandbox-moves.js';
import { type SandboxRecords, SqlSandboxRecords } from './store/sandboxes.js';
import { type VolumeRecords, SqlVolumeRecords } from './store/volumes.js';

export type { ActiveKey, KeyRecords } from './store/api-keys.js';
export type { BatchRecords, StoredBatch } from './store/batches.js';
export type { EdgeRecords, StoredEdge } from './store/edges.js';
export type { ImageOwnerRecords } from './store/image-owners.js';
export type { LeaseRecords } from './store/leases.js';
export type { PoolClaim, PoolRecords, StoredPool } from './store/pools.js';
export type { ProjectRecords, StoredProject } from './store/projects.js';
export type { SandboxMoveRecords, StoredMove } from './store/sandbox-moves.js';
export type { BatchItem, CreateLease, SandboxFilter, SandboxRecords } from './store/sandboxes.js';
export type { StoredVolume, VolumeRecords } from './store/volumes.js';

/**
 * Everything the control plane keeps, one store per kind of record (`store/<record>.ts`: an
 * interface, which is all a service sees, and its SQL), in SQL both engines run, on SQLite (a
 * file: the embedded default) or PostgreSQL (a `postgres://` URL: shared by several control-plane
 * replicas). The schema comes from the one migration list (store/migrations.ts). Records without a
 * store here (trajectories, ended sandboxes, snapshot images, the image catalog, registry blobs)
 * are kept by their service on `db`.
 */
export class StateStore {
  readonly projects: ProjectRecords;
  readonly imageOwners: ImageOwnerRecords;
  readonly batches: BatchRecords;
  readonly pools: PoolRecords;
  readonly edges: EdgeRecords;
  /** Leases and settings control-plane replicas share. */
  readonly leases: LeaseRecords;
  readonly keys: KeyRecords;
  /** Sandboxes, their specs, expiry and create leases. */
  readonly sandboxes: SandboxRecords;
  /** Sandboxes moving between edges (on the sandboxes' rows). */
  readonly moves: SandboxMoveRecords;
  readonly volumes: VolumeRecords;

  /** Changes to what the records keep in memory, by other replicas (PostgreSQL) or other connections (SQLite). */
  readonly #feed: ChangeFeed | undefined;

  private constructor(
    readonly db: SqlDb,
    feed?: ChangeFeed,
  ) {
    this.#feed = feed;
    this.projects = new SqlProjectRecords(db, feed);
    this.imageOwners = new SqlImageOwnerRecords(db, feed);
    this.batches = new SqlBatchRecords(db);
    this.pools = new SqlPoolRecords(db);
    this.edges = new SqlEdgeRecords(db);
    this.leases = new SqlLeaseRecords(db);
    this.keys = new SqlKeyRecords(db, feed);
    this.sandboxes = new SqlSandboxRecords(db);
    this.moves = new SqlSandboxMoveRecords(db);
    this.volumes = new SqlVolumeRecords(db);
  }

  /**
   * Opens (and migrates) the store at `location`: a `postgres://` or `postgresql://` URL
   * (PostgreSQL, which several control-plane replicas may share), else a file path (SQLite).
   */
  static async open(location: string, opts: { onError?: (err: Error) => void; arrivals?: RequestArrivals } = {}): Promise<StateStore> {
    const db: SqlDb = isPostgresUrl(location) ? new PostgresDb(location, opts) : new SqliteDb(location);
    try {
      await migrate(db);
      // Rows an older dsec appended after their sandbox was deleted (the table has no foreign key);
      // an ended sandbox's trajectory stays until its tombstone expires.
      await db.run(
        'DELETE FROM trajectory WHERE sandbox_id NOT IN (SELECT id FROM sandboxes) AND sandbox_id NOT IN (SELECT id FROM ended_sandboxes)',
      );
    } catch (err) {
      await db.close();
      throw err;
    }
    // Keys, projects and image owners are kept in memory while changes are heard: PostgreSQL's
    // replicas hear each other's; SQLite looks for other connections' commits before each read.
    // `arrivals`: the server's requests, so that a request's reads share one look (SqliteChangeFeed).
    return new StateStore(db, db instanceof SqliteDb ? new SqliteChangeFeed(db, opts.arrivals) : await PostgresChangeFeed.start(location));
  }

  async close(): Promise<void> {
    await this.#feed?.close();
    await this.db.close();
  }
}

/** Whether a --store value names a PostgreSQL database rather than a SQLite file. */
export function isPostgresUrl(location: string): boolean {
  return /^postgres(ql)?:\/\//.test(location);
}
