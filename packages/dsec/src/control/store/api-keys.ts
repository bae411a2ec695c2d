import type { ApiKeyInfo } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { announceChange, type ChangeFeed } from './change-feed.js';
import type { MaybePromise } from '../../maybe-promise.js';
import { ReadCache } from './read-cache.js';
import type { SqlDb } from './sql.js';

/** A key that authenticates: what a request made with it may do. */
export interface ActiveKey {
  id: string;
  name: string;
  project: string;
  admin: boolean;
}

/** API keys, by the hash of their secret (control/api-keys.ts mints and checks them). */
export interface KeyRecords {
  count(): Promise<number>;
  /** `mintedBy`: the key that made this one (an E2B key a project key minted): revoked with it. */
  insert(id: string, hash: string, name: string, project?: string, admin?: boolean, mintedBy?: string): Promise<void>;
  /** A key that is not revoked, by the hash of its secret (at once when kept in memory: read-cache.ts). */
  byHash(hash: string): MaybePromise<ActiveKey | undefined>;
  list(project?: string): Promise<ApiKeyInfo[]>;
  /**
   * Revokes a key at once (the next request with it is a 401), and every key minted from it, at
   * any depth (an E2B key may mint E2B keys); false when there is no such key.
   */
  revoke(id: string): Promise<boolean>;
}

/** Keys a replica keeps in memory at most (a key is a few hundred bytes). */
const CACHED_KEYS = 10_000;
/** How long a kept key is trusted with no word from the change feed (it says at once when one is revoked). */
const KEY_TTL_MS = 10_000;

export class SqlKeyRecords implements KeyRecords {
  /**
   * Found keys by hash (every request looks its key up): a revocation by any replica empties it
   * through the change feed, in the revoking transaction. A hash that finds nothing is not kept,
   * so a key made at another replica works there at once.
   */
  readonly #active: ReadCache<ActiveKey | undefined>;

  constructor(
    private readonly db: SqlDb,
    feed?: ChangeFeed,
  ) {
    this.#active = new ReadCache(feed, 'api_keys', { ttlMs: KEY_TTL_MS, maxEntries: CACHED_KEYS, keep: (k) => k !== undefined });
  }

  async count(): Promise<number> {
    return (await this.db.get<{ n: number }>('SELECT count(*) AS n FROM api_keys'))!.n;
  }

  async insert(id: string, hash: string, name: string, project: string = DEFAULT_PROJECT, admin = false, mintedBy?: string): Promise<void> {
    await this.db.run('INSERT INTO api_keys (id, hash, name, created_at, project, admin, minted_by) VALUES (?, ?, ?, ?, ?, ?, ?)', [
      id,
      hash,
      name,
      new Date().toISOString(),
      project,
      admin ? 1 : 0,
      mintedBy ?? null,
    ]);
  }

  byHash(hash: string): MaybePromise<ActiveKey | undefined> {
    return this.#active.get(hash, async () => {
      const r = await this.db.get<{ id: string; name: string; project: string; admin: number }>(
        'SELECT id, name, project, admin FROM api_keys WHERE hash = ? AND revoked_at IS NULL',
        [hash],
      );
      return r && { id: r.id, name: r.name, project: r.project, admin: Number(r.admin) === 1 };
    });
  }

  async list(project?: string): Promise<ApiKeyInfo[]> {
    const sql = `SELECT id, name, project, admin, created_at, revoked_at, minted_by FROM api_keys ${project ? 'WHERE project = ?' : ''} ORDER BY created_at, id`;
    const rows = await this.db.all<{
      id: string;
      name: string;
      project: string;
      admin: number;
      created_at: string;
      revoked_at: string | null;
      minted_by: string | null;
    }>(sql, project ? [project] : []);
    return rows.map((r) => {
      const k: ApiKeyInfo = { id: r.id, name: r.name, project: r.project, admin: Number(r.admin) === 1, createdAt: r.created_at };
      if (r.revoked_at) k.revokedAt = r.revoked_at;
      if (r.minted_by) k.mintedBy = r.minted_by;
      return k;
    });
  }

  async revoke(id: string): Promise<boolean> {
    if (!(await this.db.get('SELECT 1 AS one FROM api_keys WHERE id = ?', [id]))) return false;
    const now = new Date().toISOString();
    await this.db.transaction(async (tx) => {
      let ids = [id];
      const seen = new Set(ids);
      while (ids.length) {
        const marks = ids.map(() => '?').join(', ');
        await tx.run(`UPDATE api_keys SET revoked_at = ? WHERE id IN (${marks}) AND revoked_at IS NULL`, [now, ...ids]);
        const children = await tx.all<{ id: string }>(`SELECT id FROM api_keys WHERE minted_by IN (${marks})`, ids);
        ids = children.map((c) => c.id).filter((c) => !seen.has(c));
        for (const c of ids) seen.add(c);
      }
      await announceChange(tx, this.#active.topic);
    });
    this.#active.invalidate();
    return true;
  }
}
