import type { SandboxInfo } from '@dsec/sdk/schema';
import type { StateStore } from './state-store.js';

/** How long a killed sandbox's trajectory stays readable, unless configured. */
export const DEFAULT_TRAJECTORY_RETENTION_HOURS = 24;

/**
 * Sandboxes that were killed, kept as a tombstone for a while so that their trajectory stays
 * readable by id (`GET /v1/sandboxes/{id}/trajectory`, `dsec log ID`) after the kill: a trainer
 * often reads the log of a rollout it already ended. The sandbox row goes at kill; the trajectory
 * rows stay until the tombstone expires.
 */
export class EndedSandboxes {
  #tableMade = false;

  constructor(
    private readonly store: StateStore,
    /** 0 keeps nothing: the trajectory goes with the sandbox. */
    readonly retentionMs: number,
  ) {}

  /** The store's database, with this table made at first use (the constructor touches nothing). */
  get #db(): StateStore['db'] {
    if (!this.#tableMade) {
      this.store.db.exec(`CREATE TABLE IF NOT EXISTS ended_sandboxes (
        id TEXT PRIMARY KEY,
        ended_at INTEGER NOT NULL,
        reason TEXT NOT NULL
      );
      CREATE INDEX IF NOT EXISTS ended_sandboxes_at ON ended_sandboxes(ended_at);`);
      this.#tableMade = true;
    }
    return this.store.db;
  }

  /** Removes the sandbox's record; its trajectory stays for the retention time (or goes now when that is 0). */
  retire(s: SandboxInfo, reason: string, now = Date.now()): void {
    if (this.retentionMs <= 0) {
      this.store.deleteSandbox(s.id);
      return;
    }
    this.#db.transaction(() => {
      this.#db.prepare('INSERT OR REPLACE INTO ended_sandboxes (id, ended_at, reason) VALUES (?, ?, ?)').run(s.id, now, reason);
      this.#db.prepare('DELETE FROM sandboxes WHERE id = ?').run(s.id);
    })();
  }

  /** When and why a sandbox ended, and until when its trajectory is kept; undefined if unknown or expired. */
  get(id: string, now = Date.now()): { endedAt: string; reason: string; keptUntil: string } | undefined {
    const row = this.#db.prepare('SELECT ended_at, reason FROM ended_sandboxes WHERE id = ?').get(id) as { ended_at: number; reason: string } | undefined;
    if (!row || row.ended_at + this.retentionMs <= now) return undefined;
    return { endedAt: new Date(row.ended_at).toISOString(), reason: row.reason, keptUntil: new Date(row.ended_at + this.retentionMs).toISOString() };
  }

  /** Deletes tombstones past the retention time with their trajectories; returns how many. */
  expire(now = Date.now()): number {
    const cutoff = now - this.retentionMs;
    return this.#db.transaction(() => {
      this.#db.prepare('DELETE FROM trajectory WHERE sandbox_id IN (SELECT id FROM ended_sandboxes WHERE ended_at <= ?)').run(cutoff);
      return this.#db.prepare('DELETE FROM ended_sandboxes WHERE ended_at <= ?').run(cutoff).changes;
    })();
  }
}
