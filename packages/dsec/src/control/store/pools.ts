import { saveLabelRows } from './sandboxes.js';
import type { SqlDb } from './sql.js';

export interface StoredPool {
  name: string;
  size: number;
  spec: unknown;
  createdAt: string;
}

/** What a caller's claim makes of a pool sandbox. */
export interface PoolClaim {
  labels: Record<string, string>;
  ttlSeconds?: number | undefined;
  idleTimeoutSeconds?: number | undefined;
  onExpiry: 'stop' | 'pause';
  at: number;
  project: string;
  /** The E2B access token the claiming create made (store/sandboxes.ts accessToken). */
  accessToken?: string | undefined;
}

/** Warm pools and the claim of their ready sandboxes (control/warm-pools.ts). */
export interface PoolRecords {
  insert(p: StoredPool): Promise<void>;
  list(): Promise<StoredPool[]>;
  delete(name: string): Promise<void>;
  /**
   * Hands an unclaimed pool sandbox to a caller: its labels (which said it was ready) become the
   * caller's, with the caller's expiry. False when it was claimed already (by another
   * control-plane replica, say): the update is conditional on the labels it had, so it is the claim.
   */
  claimSandbox(sandboxId: string, readyLabels: Record<string, string>, claim: PoolClaim): Promise<boolean>;
}

export class SqlPoolRecords implements PoolRecords {
  constructor(private readonly db: SqlDb) {}

  async insert(p: StoredPool): Promise<void> {
    await this.db.run('INSERT INTO pools (name, size, spec, created_at) VALUES (?, ?, ?, ?)', [
      p.name,
      p.size,
      JSON.stringify(p.spec),
      p.createdAt,
    ]);
  }

  async list(): Promise<StoredPool[]> {
    const rows = await this.db.all<{ name: string; size: number; spec: string; created_at: string }>(
      'SELECT name, size, spec, created_at FROM pools ORDER BY name',
    );
    return rows.map((r) => ({ name: r.name, size: r.size, spec: JSON.parse(r.spec) as unknown, createdAt: r.created_at }));
  }

  async delete(name: string): Promise<void> {
    await this.db.run('DELETE FROM pools WHERE name = ?', [name]);
  }

  async claimSandbox(sandboxId: string, readyLabels: Record<string, string>, claim: PoolClaim): Promise<boolean> {
    const expiresAt = claim.ttlSeconds === undefined ? null : claim.at + claim.ttlSeconds * 1000;
    return this.db.transaction(async (tx) => {
      const r = await tx.run(
        "UPDATE sandboxes SET labels = ?, ttl_seconds = ?, idle_timeout_seconds = ?, on_expiry = ?, expires_at = ?, last_activity = ?, project = ?, access_token = ? WHERE id = ? AND labels = ? AND status = 'running'",
        [
          JSON.stringify(claim.labels),
          claim.ttlSeconds ?? null,
          claim.idleTimeoutSeconds ?? null,
          claim.onExpiry,
          expiresAt,
          claim.at,
          claim.project,
          claim.accessToken ?? null,
          sandboxId,
          JSON.stringify(readyLabels),
        ],
      );
      if (r.changes === 1) {
        const row = await tx.get<{ created_at: string }>('SELECT created_at FROM sandboxes WHERE id = ?', [sandboxId]);
        await saveLabelRows(tx, sandboxId, claim.labels, row!.created_at, true);
      }
      return r.changes === 1;
    });
  }
}
