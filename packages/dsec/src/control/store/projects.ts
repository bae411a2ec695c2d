import type { ProjectQuota, ProjectUsage } from '@dsec/sdk/schema';
import { foldCounts } from './sandboxes.js';
import { announceChange, type ChangeFeed } from './change-feed.js';
import type { MaybePromise } from '../../maybe-promise.js';
import { ReadCache } from './read-cache.js';
import type { Sql, SqlDb } from './sql.js';

export interface StoredProject {
  name: string;
  quota: ProjectQuota;
  createdAt: string;
}

/** Projects and what their live sandboxes hold (docs/PROJECTS.md). */
export interface ProjectRecords {
  /** False when a project of that name exists already. */
  insert(name: string, quota: ProjectQuota): Promise<boolean>;
  /** At once when kept in memory (read-cache.ts). */
  get(name: string): MaybePromise<StoredProject | undefined>;
  list(): Promise<StoredProject[]>;
  setQuota(name: string, quota: ProjectQuota): Promise<void>;
  /** What a project's live sandboxes (creating, running, paused) hold: what its quotas count. */
  usage(project: string): Promise<ProjectUsage>;
}

interface ProjectRow {
  name: string;
  quota: string;
  created_at: string;
}

/** Projects a replica keeps in memory at most, and how long with no word from the change feed. */
const CACHED_PROJECTS = 10_000;
const PROJECT_TTL_MS = 10_000;

const fromRow = (r: ProjectRow): StoredProject => ({ name: r.name, quota: JSON.parse(r.quota) as ProjectQuota, createdAt: r.created_at });

export class SqlProjectRecords implements ProjectRecords {
  /**
   * Projects by name, a project that does not exist included (every create reads its project's
   * quota): a change by any replica empties it through the change feed, in the changing transaction.
   */
  readonly #byName: ReadCache<StoredProject | undefined>;

  constructor(
    private readonly db: SqlDb,
    feed?: ChangeFeed,
  ) {
    this.#byName = new ReadCache(feed, 'projects', { ttlMs: PROJECT_TTL_MS, maxEntries: CACHED_PROJECTS });
  }

  async insert(name: string, quota: ProjectQuota): Promise<boolean> {
    const changes = await this.#changing(
      async (tx) =>
        (
          await tx.run('INSERT INTO projects (name, quota, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING', [
            name,
            JSON.stringify(quota),
            new Date().toISOString(),
          ])
        ).changes,
    );
    return changes === 1;
  }

  get(name: string): MaybePromise<StoredProject | undefined> {
    return this.#byName.get(name, async () => {
      const r = await this.db.get<ProjectRow>('SELECT name, quota, created_at FROM projects WHERE name = ?', [name]);
      return r && fromRow(r);
    });
  }

  /** A change of projects' rows, announced to every replica with it and forgotten here at once. */
  async #changing<T>(change: (tx: Sql) => Promise<T>): Promise<T> {
    const out = await this.db.transaction(async (tx) => {
      const r = await change(tx);
      await announceChange(tx, this.#byName.topic);
      return r;
    });
    this.#byName.invalidate();
    return out;
  }

  async list(): Promise<StoredProject[]> {
    return (await this.db.all<ProjectRow>('SELECT name, quota, created_at FROM projects ORDER BY name')).map(fromRow);
  }

  async setQuota(name: string, quota: ProjectQuota): Promise<void> {
    await this.#changing((tx) => tx.run('UPDATE projects SET quota = ? WHERE name = ?', [JSON.stringify(quota), name]));
  }

  async usage(project: string): Promise<ProjectUsage> {
    // From the counts kept as rows change (sandbox_counts): a project of 400,000 sandboxes is a
    // few groups, not 400,000 rows summed at each create a quota admits.
    await foldCounts(this.db);
    const r = await this.db.get<{ n: number | string; cpu: number | string; mem: number | string }>(
      "SELECT COALESCE(SUM(n), 0) AS n, COALESCE(SUM(cpu), 0) AS cpu, COALESCE(SUM(memory_mib), 0) AS mem FROM sandbox_counts WHERE project = ? AND status IN ('creating', 'running', 'paused')",
      [project],
    );
    // PostgreSQL answers count and SUM over integers as bigint (a string in node-postgres).
    return { sandboxes: Number(r?.n ?? 0), cpu: Math.round(Number(r?.cpu ?? 0) * 1000) / 1000, memoryMiB: Number(r?.mem ?? 0) };
  }
}
