import type { SandboxStatus } from '@dsec/sdk/schema';
import type { SqlDb } from './sql.js';

/** A move in flight, as its row carries it. */
export interface StoredMove {
  id: string;
  /** The edge it runs on until the move is committed. */
  from: string;
  to: string;
  owner: string;
  status: SandboxStatus;
  since: number;
}

/**
 * Sandboxes moving between edges (control/service/migration.ts), kept on their rows: the target
 * edge, the replica moving it and the lease it renews, as a create's. A row names one edge at a
 * time: the source until commit() swaps it for the target in one conditional UPDATE, so a move
 * is on one edge or the other for every reader, never both and never neither.
 */
export interface SandboxMoveRecords {
  /** Marks `id` as moving to `to`, only if it is running or paused and not moving already; false otherwise. */
  begin(id: string, to: string, lease: { owner: string; until: number }, now?: number): Promise<boolean>;
  /** The move of `id` if one is in flight. */
  get(id: string): Promise<StoredMove | undefined>;
  /**
   * The layers the moving sandbox is started from (its packed state over its image's), on its
   * row before its source copy is removed: the image GC keeps them, and a move given up after
   * that point knows what the sandbox was.
   */
  stage(id: string, to: string, layers: readonly string[]): Promise<void>;
  /** Extends the lease of every move `owner` has in flight. */
  renew(owner: string, until: number): Promise<number>;
  /**
   * The move happened: the row names `to` (and the layers it runs from there), a row the lost
   * edge watcher marked `lost` meanwhile (its source stopped reporting) is `live` again. False when the row is gone (killed during
   * the move) or no longer moving to `to` (another replica gave the move up): the target's copy
   * must then go.
   */
  commit(id: string, to: string, layers: readonly string[], live: 'running' | 'paused'): Promise<boolean>;
  /** The move is given up: the row stays on its source. */
  abort(id: string, to: string): Promise<void>;
  /** Moves to `edge` some replica still vouches for at `now`: reconcile leaves them to their move. */
  leasedTo(edge: string, now: number): Promise<Set<string>>;
  /** Moves whose replica stopped renewing their lease before `now`. */
  abandoned(now: number): Promise<StoredMove[]>;
}

interface MoveRow {
  id: string;
  edge: string;
  move_to: string;
  move_owner: string;
  status: SandboxStatus;
  move_since: number;
}

const toMove = (r: MoveRow): StoredMove => ({
  id: r.id,
  from: r.edge,
  to: r.move_to,
  owner: r.move_owner,
  status: r.status,
  since: Number(r.move_since),
});

export class SqlSandboxMoveRecords implements SandboxMoveRecords {
  constructor(private readonly db: SqlDb) {}

  async begin(id: string, to: string, lease: { owner: string; until: number }, now = Date.now()): Promise<boolean> {
    const { changes } = await this.db.run(
      "UPDATE sandboxes SET move_to = ?, move_owner = ?, move_until = ?, move_since = ? WHERE id = ? AND move_to IS NULL AND status IN ('running', 'paused') AND edge <> ?",
      [to, lease.owner, lease.until, now, id, to],
    );
    return changes === 1;
  }

  async get(id: string): Promise<StoredMove | undefined> {
    const row = await this.db.get<MoveRow>(
      'SELECT id, edge, move_to, move_owner, status, move_since FROM sandboxes WHERE id = ? AND move_to IS NOT NULL',
      [id],
    );
    return row && toMove(row);
  }

  async stage(id: string, to: string, layers: readonly string[]): Promise<void> {
    await this.db.run('UPDATE sandboxes SET layers = ? WHERE id = ? AND move_to = ?', [JSON.stringify(layers), id, to]);
  }

  async renew(owner: string, until: number): Promise<number> {
    const { changes } = await this.db.run('UPDATE sandboxes SET move_until = ? WHERE move_owner = ? AND move_to IS NOT NULL', [
      until,
      owner,
    ]);
    return changes;
  }

  async commit(id: string, to: string, layers: readonly string[], live: 'running' | 'paused'): Promise<boolean> {
    const { changes } = await this.db.run(
      `UPDATE sandboxes SET edge = move_to, layers = ?, move_to = NULL, move_owner = NULL, move_until = NULL, move_since = NULL,
         status = CASE WHEN status = 'lost' THEN ? ELSE status END,
         reason = CASE WHEN status = 'lost' THEN NULL ELSE reason END
       WHERE id = ? AND move_to = ?`,
      [JSON.stringify(layers), live, id, to],
    );
    return changes === 1;
  }

  async abort(id: string, to: string): Promise<void> {
    await this.db.run(
      'UPDATE sandboxes SET move_to = NULL, move_owner = NULL, move_until = NULL, move_since = NULL WHERE id = ? AND move_to = ?',
      [id, to],
    );
  }

  async leasedTo(edge: string, now: number): Promise<Set<string>> {
    const rows = await this.db.all<{ id: string }>('SELECT id FROM sandboxes WHERE move_to = ? AND move_until >= ?', [edge, now]);
    return new Set(rows.map((r) => r.id));
  }

  async abandoned(now: number): Promise<StoredMove[]> {
    const rows = await this.db.all<MoveRow>(
      'SELECT id, edge, move_to, move_owner, status, move_since FROM sandboxes WHERE move_to IS NOT NULL AND move_until < ?',
      [now],
    );
    return rows.map(toMove);
  }
}
