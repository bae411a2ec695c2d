import type { SqlDb } from './sql.js';

/** What control-plane replicas share: named leases (who sweeps, who renews) and settings. */
export interface LeaseRecords {
  /**
   * Takes or renews the lease `name` for `holder` until `now + ttlMs`: granted when nobody holds
   * it, the holder already does, or the last holder's lease ran out (it stopped renewing: dead or
   * cut off). One statement, so two replicas asking at once cannot both get it.
   */
  acquire(name: string, holder: string, ttlMs: number, now?: number): Promise<boolean>;
  /** Gives a lease up (a replica shutting down), so another takes it at once. */
  release(name: string, holder: string): Promise<void>;
  /** A value every replica shares (the cluster token); the first one written stays. */
  sharedSetting(name: string, proposed: string): Promise<string>;
}

export class SqlLeaseRecords implements LeaseRecords {
  constructor(private readonly db: SqlDb) {}

  async acquire(name: string, holder: string, ttlMs: number, now = Date.now()): Promise<boolean> {
    const row = await this.db.get<{ holder: string }>(
      `INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)
       ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
       WHERE leases.holder = excluded.holder OR leases.expires_at < ?
       RETURNING holder`,
      [name, holder, now + ttlMs, now],
    );
    return row?.holder === holder;
  }

  async release(name: string, holder: string): Promise<void> {
    await this.db.run('DELETE FROM leases WHERE name = ? AND holder = ?', [name, holder]);
  }

  async sharedSetting(name: string, proposed: string): Promise<string> {
    await this.db.run('INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [name, proposed]);
    return (await this.db.get<{ value: string }>('SELECT value FROM settings WHERE name = ?', [name]))!.value;
  }
}
