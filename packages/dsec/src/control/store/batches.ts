import type { BatchEvent } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { SqlDb } from './sql.js';

export interface StoredBatch {
  id: string;
  project: string;
  count: number;
  spec: string;
  state: 'running' | 'done' | 'cancelled';
  createdAt: string;
  finishedAt?: string;
  /** Counts of its events, kept on its row as they are appended (a finished batch's status reads these, not 64,000 events). */
  placed: number;
  running: number;
  failed: number;
  /** The last event's seq (-1: none yet). */
  lastSeq: number;
}

/** Batches, their event logs, and which replica drives each (control/batches.ts). */
export interface BatchRecords {
  /** `owner`: the replica that drives the batch, and until when it vouches for it. */
  insert(
    id: string,
    count: number,
    req: unknown,
    createdAt: string,
    project?: string,
    owner?: { id: string; until: number },
  ): Promise<void>;
  get(id: string): Promise<StoredBatch | undefined>;
  list(state?: StoredBatch['state']): Promise<StoredBatch[]>;
  finish(id: string, state: 'done' | 'cancelled', at: string): Promise<void>;
  /**
   * Appends events, one transaction for many (a 32,000-sandbox batch makes ~64,000); each batch's
   * counts on its row move with them. With `owner`, a batch another replica owns now (it took the
   * batch over) gets none of them: its ids are returned, and their events dropped, since the new
   * owner numbers its events from where it took over. `texts`, when given, is each event's JSON
   * (the caller made it already for its streams), in the order of `events`, which is seq order.
   */
  appendEvents(groups: EventGroup[], owner?: string): Promise<string[]>;
  /** A batch's events after sequence number `after`, in order. */
  events(id: string, after: number): Promise<BatchEvent[]>;
  /** The sandbox rows a batch made, by item index (whatever their status). */
  sandboxes(batchId: string): Promise<{ index: number; id: string }[]>;
  /**
   * Renews this replica's batches; returns those whose cancel another replica asked for, and
   * those another replica owns now (it took them over: their lease ran out before this renewal).
   */
  renew(ids: string[], owner: string, until: number): Promise<{ cancel: string[]; lost: string[] }>;
  /**
   * Running batches nobody drives (no owner, or an owner whose lease ran out) become `owner`'s;
   * `all` takes every running batch (a lone control plane after its own restart).
   */
  claim(owner: string, until: number, now: number, all?: boolean): Promise<StoredBatch[]>;
  /** Asks the batch's owner (maybe another replica) to cancel it; it sees this at its next renew. */
  requestCancel(id: string): Promise<void>;
}

/** A batch's events to append, in seq order; `texts[i]`, when given, is `events[i]` as JSON. */
export interface EventGroup {
  id: string;
  events: { seq: number; type?: string }[];
  texts?: string[];
}

interface BatchRow {
  id: string;
  count: number;
  spec: string;
  state: StoredBatch['state'];
  created_at: string;
  finished_at: string | null;
  project: string;
  placed: number;
  running: number;
  failed: number;
  last_seq: number;
}

function fromRow(r: BatchRow): StoredBatch {
  const b: StoredBatch = {
    id: r.id,
    project: r.project,
    count: r.count,
    spec: r.spec,
    state: r.state,
    createdAt: r.created_at,
    placed: Number(r.placed),
    running: Number(r.running),
    failed: Number(r.failed),
    lastSeq: Number(r.last_seq),
  };
  if (r.finished_at) b.finishedAt = r.finished_at;
  return b;
}

export class SqlBatchRecords implements BatchRecords {
  constructor(private readonly db: SqlDb) {}

  async insert(
    id: string,
    count: number,
    req: unknown,
    createdAt: string,
    project: string = DEFAULT_PROJECT,
    owner?: { id: string; until: number },
  ): Promise<void> {
    await this.db.run(
      "INSERT INTO batches (id, count, spec, state, created_at, project, owner, lease_until) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
      [id, count, JSON.stringify(req), createdAt, project, owner?.id ?? null, owner?.until ?? null],
    );
  }

  async get(id: string): Promise<StoredBatch | undefined> {
    const r = await this.db.get<BatchRow>('SELECT * FROM batches WHERE id = ?', [id]);
    return r && fromRow(r);
  }

  async list(state?: StoredBatch['state']): Promise<StoredBatch[]> {
    const rows = state
      ? await this.db.all<BatchRow>('SELECT * FROM batches WHERE state = ? ORDER BY created_at', [state])
      : await this.db.all<BatchRow>('SELECT * FROM batches ORDER BY created_at');
    return rows.map(fromRow);
  }

  async finish(id: string, state: 'done' | 'cancelled', at: string): Promise<void> {
    await this.db.run('UPDATE batches SET state = ?, finished_at = ? WHERE id = ?', [state, at, id]);
  }

  async appendEvents(groups: EventGroup[], owner?: string): Promise<string[]> {
    // PostgreSQL: the batch's row is locked until the commit, so an owner's change or another
    // writer's run is seen whole. SQLite has one writer at a time.
    const lock = this.db.dialect === 'postgres' ? ' FOR UPDATE' : '';
    return this.db.transaction(async (tx) => {
      const lost: string[] = [];
      for (const g of groups) {
        const row = await tx.get<{ owner: string | null; last_seq: number }>(`SELECT owner, last_seq FROM batches WHERE id = ?${lock}`, [
          g.id,
        ]);
        if (!row) continue; // gone: its events have nowhere to go
        if (owner !== undefined && row.owner !== null && row.owner !== owner) {
          lost.push(g.id);
          continue;
        }
        // Events are numbered in order and written in order (BatchService.flush): one at or below
        // the last written is there already (written again after a restart) and is not counted twice.
        const lastSeq = Number(row.last_seq);
        const from = g.events.findIndex((e) => e.seq > lastSeq);
        if (from < 0) continue;
        const n = { placed: 0, running: 0, failed: 0 };
        let json = '[';
        for (let i = from; i < g.events.length; i++) {
          const e = g.events[i]!;
          if (e.type === 'placed') n.placed++;
          else if (e.type === 'running') n.running++;
          else if (e.type === 'failed') n.failed++;
          json += `${i > from ? ',' : ''}${g.texts?.[i] ?? JSON.stringify(e)}`;
        }
        const last = g.events[g.events.length - 1]!.seq;
        await tx.run('INSERT INTO batch_event_runs (batch_id, last_seq, first_seq, events) VALUES (?, ?, ?, ?)', [
          g.id,
          last,
          g.events[from]!.seq,
          `${json}]`,
        ]);
        await tx.run('UPDATE batches SET placed = placed + ?, running = running + ?, failed = failed + ?, last_seq = ? WHERE id = ?', [
          n.placed,
          n.running,
          n.failed,
          last,
          g.id,
        ]);
      }
      return lost;
    });
  }

  async events(id: string, after: number): Promise<BatchEvent[]> {
    // Runs end in order of their keys: those ending after `after` are one range of the key, and
    // only the first of them may begin at or before it.
    const runs = await this.db.all<{ events: string }>(
      'SELECT events FROM batch_event_runs WHERE batch_id = ? AND last_seq > ? ORDER BY last_seq',
      [id, after],
    );
    const out: BatchEvent[] = [];
    for (const r of runs) for (const e of JSON.parse(r.events) as BatchEvent[]) if (e.seq > after) out.push(e);
    return out;
  }

  async sandboxes(batchId: string): Promise<{ index: number; id: string }[]> {
    return this.db.all<{ index: number; id: string }>('SELECT batch_index AS "index", id FROM sandboxes WHERE batch_id = ?', [batchId]);
  }

  async renew(ids: string[], owner: string, until: number): Promise<{ cancel: string[]; lost: string[] }> {
    if (ids.length === 0) return { cancel: [], lost: [] };
    const marks = ids.map(() => '?').join(', ');
    await this.db.run(`UPDATE batches SET lease_until = ? WHERE owner = ? AND id IN (${marks})`, [until, owner, ...ids]);
    const rows = await this.db.all<{ id: string; owner: string | null; cancel_requested: number }>(
      `SELECT id, owner, cancel_requested FROM batches WHERE id IN (${marks})`,
      ids,
    );
    return {
      cancel: rows.filter((r) => r.owner === owner && Number(r.cancel_requested) === 1).map((r) => r.id),
      lost: rows.filter((r) => r.owner !== null && r.owner !== owner).map((r) => r.id),
    };
  }

  async claim(owner: string, until: number, now: number, all = false): Promise<StoredBatch[]> {
    const rows = await this.db.all<BatchRow>(
      `UPDATE batches SET owner = ?, lease_until = ? WHERE state = 'running' AND (? = 1 OR owner IS NULL OR lease_until IS NULL OR lease_until < ?) RETURNING *`,
      [owner, until, all ? 1 : 0, now],
    );
    return rows.map(fromRow).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  async requestCancel(id: string): Promise<void> {
    await this.db.run('UPDATE batches SET cancel_requested = 1 WHERE id = ?', [id]);
  }
}
