import type { TrajectoryEntry, TrajectoryKind, TrajectoryLine } from '@dsec/sdk/schema';
import type { StateStore } from './state-store.js';

/** Entries kept per sandbox; later ones are counted as dropped. */
export const MAX_ENTRIES = 10_000;
/** Command output kept per stream per entry. */
export const MAX_LOGGED_OUTPUT = 64 << 10;
/** File and tar payloads kept for replay; larger ones make the step unreplayable. */
export const MAX_PAYLOAD = 8 << 20;
/**
 * Payloads kept per sandbox, together: past it a step's payload is not kept (the step is
 * unreplayable, as a larger one is). Without it, 10,000 uploads of 8 MiB could keep 78 GiB of one
 * sandbox's state in the store, whatever its own disk limit.
 */
export const MAX_PAYLOAD_TOTAL = 256 << 20;

export interface NewEntry {
  kind: TrajectoryKind;
  request: Record<string, unknown>;
  result?: Record<string, unknown>;
  payload?: Buffer;
  durationMs?: number;
  exitCode?: number;
  /** Override: steps such as interactive terminals cannot be re-run. */
  replayable?: boolean;
}

function capOutput(result: Record<string, unknown> | undefined): Record<string, unknown> | undefined {
  if (!result) return result;
  const out = { ...result };
  for (const k of ['stdout', 'stderr']) {
    const v = out[k];
    if (typeof v === 'string' && v.length > MAX_LOGGED_OUTPUT) {
      out[k] = v.slice(0, MAX_LOGGED_OUTPUT);
      out['logTruncated'] = true;
    }
  }
  return out;
}

/**
 * Every state-changing step of a sandbox (commands, session commands, file changes) with its
 * result, in order: the trainer can read what happened, and a replay can rebuild the sandbox.
 * It is kept by the control plane (its state store), not the edge, so it outlives the node the sandbox ran
 * on: a sandbox lost with its node can still be rebuilt elsewhere.
 */
export class TrajectoryLog {
  /** `maxPayloadTotal`: MAX_PAYLOAD_TOTAL but in tests. */
  constructor(
    private readonly store: StateStore,
    private readonly maxPayloadTotal = MAX_PAYLOAD_TOTAL,
  ) {}

  /**
   * Appends a step of a sandbox that still has its row. A step that finishes after the sandbox was
   * killed (a terminal's exit, a stream's last entry) is not logged: its rows are gone with it.
   * Steps past MAX_ENTRIES are counted in the sandbox's row, so the count survives a restart.
   */
  async append(sandboxId: string, e: NewEntry): Promise<void> {
    // The sequence number is allocated in the transaction that writes it; on PostgreSQL the
    // sandbox's row is locked so that replicas appending to one sandbox take turns.
    await this.store.db.transaction(async (tx) => {
      const lock = tx.dialect === 'postgres' ? ' FOR UPDATE' : '';
      const sandbox = await tx.get<{ kept: number | string }>(
        `SELECT trajectory_payload_bytes AS kept FROM sandboxes WHERE id = ?${lock}`,
        [sandboxId],
      );
      if (!sandbox) return;
      const size = e.payload?.length ?? 0;
      const keepPayload = e.payload !== undefined && size <= MAX_PAYLOAD && Number(sandbox.kept) + size <= this.maxPayloadTotal;
      // Seqs run 1, 2, … with no gaps (entries are appended, copied whole, never removed one by
      // one): the last is the count, read from the index's end where count(*) walks every entry.
      const row = (await tx.get<{ last: number }>('SELECT coalesce(max(seq), 0) AS last FROM trajectory WHERE sandbox_id = ?', [
        sandboxId,
      ]))!;
      if (row.last >= MAX_ENTRIES) {
        await tx.run('UPDATE sandboxes SET trajectory_dropped = trajectory_dropped + 1 WHERE id = ?', [sandboxId]);
        return;
      }
      await tx.run(
        'INSERT INTO trajectory (sandbox_id, seq, at, kind, request, result, payload, duration_ms, exit_code, replayable) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
        [
          sandboxId,
          row.last + 1,
          new Date().toISOString(),
          e.kind,
          JSON.stringify(e.request),
          e.result === undefined ? null : JSON.stringify(capOutput(e.result)),
          keepPayload ? e.payload! : null,
          e.durationMs ?? null,
          e.exitCode ?? null,
          e.replayable === false ? 0 : e.payload === undefined || keepPayload ? 1 : 0,
        ],
      );
      if (keepPayload && size > 0)
        await tx.run('UPDATE sandboxes SET trajectory_payload_bytes = trajectory_payload_bytes + ? WHERE id = ?', [size, sandboxId]);
    });
  }

  async list(sandboxId: string, afterSeq = 0, limit = 1000): Promise<{ entries: TrajectoryEntry[]; dropped: number }> {
    const rows = await this.store.db.all<Row>(
      'SELECT seq, at, kind, request, result, duration_ms, exit_code, replayable FROM trajectory WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?',
      [sandboxId, afterSeq, limit],
    );
    const dropped = await this.store.db.get<{ n: number }>('SELECT trajectory_dropped AS n FROM sandboxes WHERE id = ?', [sandboxId]);
    return { entries: rows.map(toEntry), dropped: dropped?.n ?? 0 };
  }

  /** A sandbox's steps up to and including `seq` (an ancestor's, up to where a fork was taken from it). */
  async upTo(sandboxId: string, seq: number): Promise<TrajectoryEntry[]> {
    const rows = await this.store.db.all<Row>(
      'SELECT seq, at, kind, request, result, duration_ms, exit_code, replayable FROM trajectory WHERE sandbox_id = ? AND seq <= ? ORDER BY seq',
      [sandboxId, seq],
    );
    return rows.map(toEntry);
  }

  /** The seq of a sandbox's last logged step (0: none): where a fork taken now continues from. */
  async lastSeq(sandboxId: string): Promise<number> {
    const row = await this.store.db.get<{ last: number | string }>(
      'SELECT coalesce(max(seq), 0) AS last FROM trajectory WHERE sandbox_id = ?',
      [sandboxId],
    );
    return Number(row?.last ?? 0);
  }

  /**
   * One page of several sandboxes' steps, ordered by sandbox id then seq, after the position
   * `after` (the last line of the previous page): keyset paging over the primary key, so a bulk
   * read of a 32,000-sandbox batch holds one page in memory, never the whole log.
   */
  async page(sandboxIds: readonly string[], after: { sandboxId: string; seq: number }, limit: number): Promise<TrajectoryLine[]> {
    if (sandboxIds.length === 0) return [];
    const rows = await this.store.db.all<Row & { sandbox_id: string }>(
      `SELECT sandbox_id, seq, at, kind, request, result, duration_ms, exit_code, replayable FROM trajectory
       WHERE sandbox_id IN (${sandboxIds.map(() => '?').join(', ')}) AND (sandbox_id > ? OR (sandbox_id = ? AND seq > ?))
       ORDER BY sandbox_id, seq LIMIT ?`,
      [...sandboxIds, after.sandboxId, after.sandboxId, after.seq, limit],
    );
    return rows.map((r) => ({ sandboxId: r.sandbox_id, ...toEntry(r) }));
  }

  /**
   * Entries with their payloads, for replay, read a page at a time: the replay awaits the edge
   * between entries, and a cursor held open meanwhile would hold a connection (and, on SQLite,
   * make every write meanwhile fail with "connection is busy").
   */
  async *replayable(sandboxId: string): AsyncGenerator<TrajectoryEntry & { payload: Buffer | null }> {
    for (let after = 0; ;) {
      const rows = await this.store.db.all<Row & { payload: Buffer | null }>(
        'SELECT * FROM trajectory WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT 16',
        [sandboxId, after],
      );
      if (rows.length === 0) return;
      for (const r of rows) yield { ...toEntry(r), payload: r.payload };
      after = rows.at(-1)!.seq;
    }
  }

  /** Copies a sandbox's log to another (the replayed sandbox starts with its history). */
  async copy(from: string, to: string): Promise<void> {
    await this.store.db.transaction(async (tx) => {
      await tx.run(
        'INSERT INTO trajectory (sandbox_id, seq, at, kind, request, result, payload, duration_ms, exit_code, replayable) SELECT ?, seq, at, kind, request, result, payload, duration_ms, exit_code, replayable FROM trajectory WHERE sandbox_id = ?',
        [to, from],
      );
      // The copy's payloads count against its own total (the original may be gone: count them).
      await tx.run(
        'UPDATE sandboxes SET trajectory_payload_bytes = (SELECT coalesce(sum(length(payload)), 0) FROM trajectory WHERE sandbox_id = ?) WHERE id = ?',
        [to, to],
      );
    });
  }
}

interface Row {
  seq: number;
  at: string;
  kind: TrajectoryKind;
  request: string;
  result: string | null;
  duration_ms: number | null;
  exit_code: number | null;
  replayable: number;
}

function toEntry(r: Row): TrajectoryEntry {
  const e: TrajectoryEntry = {
    seq: r.seq,
    at: r.at,
    kind: r.kind,
    request: JSON.parse(r.request) as Record<string, unknown>,
    replayable: r.replayable === 1,
  };
  if (r.result !== null) e.result = JSON.parse(r.result) as Record<string, unknown>;
  if (r.duration_ms !== null) e.durationMs = r.duration_ms;
  // A command's figures are kept in its result; shown beside its duration for a reader's ease.
  for (const k of ['queuedMs', 'cpuMs', 'peakMemoryBytes'] as const) {
    const v = e.result?.[k];
    if (typeof v === 'number') e[k] = v;
  }
  if (r.exit_code !== null) e.exitCode = r.exit_code;
  return e;
}
