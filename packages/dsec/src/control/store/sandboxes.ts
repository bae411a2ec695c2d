import type { ListOrder, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { Sql, SqlDb, SqlValue } from './sql.js';
import { ROW_COLUMNS, ROW_COLUMNS_S, fromRow, rowOfValues, sandboxListJson, type SandboxRow } from './sandbox-info-row.js';

import {
  insertLabelRows,
  saveSpecRows,
  settleCreates,
  writeNewAndSettle,
  writeNewSandboxes,
  type BatchItem,
  type CreateLease,
} from './sandbox-rows.js';

export type { BatchItem, CreateLease } from './sandbox-rows.js';

export interface SandboxFilter {
  /** Every pair must be among the sandbox's labels. */
  labels?: Record<string, string>;
  status?: SandboxStatus;
  edge?: string;
  project?: string;
  /** At most this many (in `order`), and the cursor of the next page when there are more. */
  limit?: number;
  /** The page after this cursor (a previous page's `next`, of the same filters and order). */
  after?: string;
  /** Oldest first (the default) or newest first: the same index ranges read backwards. */
  order?: ListOrder;
}

/** One group of countGroups(): the rows of one status on one edge in one project. */
export interface SandboxCount {
  status: SandboxStatus;
  edge: string;
  project: string;
  count: number;
}

/**
 * Sandbox rows, their create requests (specs), expiry, and the leases on creates in flight (a
 * create is vouched for by its replica: control/create-leases.ts).
 */
export interface SandboxRecords {
  /**
   * `batch`: the sandbox is item `index` of a batch (unique: a batch never creates an item twice).
   * `spec`: the create request as the caller sent it (saveSpec), written in the same transaction:
   * one commit per create instead of two.
   */
  insert(s: SandboxInfo, batch?: BatchItem, spec?: unknown, lease?: CreateLease, accessToken?: string): Promise<void>;
  /** Many rows (a batch's group) in one transaction: one commit instead of one per sandbox. */
  insertMany(
    rows: { info: SandboxInfo; batch?: BatchItem; spec: unknown; specOnBatch?: boolean; accessToken?: string }[],
    lease?: CreateLease,
  ): Promise<void>;
  get(id: string): Promise<SandboxInfo | undefined>;
  /** Sandboxes that match every field of `filter`, oldest first. */
  list(filter?: SandboxFilter): Promise<SandboxInfo[]>;
  /** One page of list(): with `filter.limit`, `next` when there are more. */
  page(filter: SandboxFilter): Promise<{ sandboxes: SandboxInfo[]; next?: string }>;
  /** page() as the JSON text of its SandboxList, written from the rows (GET /v1/sandboxes answers with it). */
  pageJson(filter: SandboxFilter): Promise<string>;
  /** Rows by status, of one project or of all: from the counts kept as rows change (sandbox_counts, migration 17). */
  countByStatus(project?: string): Promise<Record<string, number>>;
  /**
   * How many rows there are of each status, edge and project: the counts kept as rows change
   * (sandbox_counts), so a scrape reads a row per group, never the sandboxes (at 400,000 rows the
   * grouped count it replaced held the event loop 35-60 ms at each scrape).
   */
  countGroups(): Promise<SandboxCount[]>;
  /**
   * Brings the kept counts up to date (PostgreSQL: folds the changes appended since; SQLite keeps
   * them so already). The reads above fold first; the expiry loop folds every second so the
   * changes between two reads stay few.
   */
  foldCounts(): Promise<void>;
  /**
   * The envd access token of a sandbox made through the E2B API (`accessToken` at insert or pool
   * claim). A column of its own, never a label: labels are listed to every key of the project
   * (dsec ps, GET /v1/sandboxes, the dashboard) and copied into specs, forks and trajectories.
   */
  accessToken(id: string): Promise<string | undefined>;
  /** The access tokens of the sandboxes that have one (of `project`, or every project), by sandbox id. */
  /** id → access token of the E2B sandboxes (of `project`; `runningOnly`: of those running now). */
  accessTokens(project?: string, runningOnly?: boolean): Promise<Map<string, string>>;
  /** The row and its trajectory. */
  delete(id: string): Promise<void>;
  /** The project of a sandbox the store has a row for (live or not). */
  projectOf(id: string): Promise<string | undefined>;
  setStatus(id: string, status: SandboxStatus, reason?: string): Promise<void>;
  /** Moves a row from `from` to `to` only if it is still `from`; false when it was not (another writer won). */
  setStatusIf(id: string, from: SandboxStatus, to: SandboxStatus, reason?: string): Promise<boolean>;
  /**
   * A group's create outcomes in one transaction; a row no longer `creating` keeps what it says
   * (its edge was lost, or another replica settled it). Returns those rows with their status.
   */
  setStatuses(
    updates: { id: string; status: SandboxStatus; reason?: string }[],
  ): Promise<Map<string, { status: SandboxStatus; reason?: string }>>;
  /** Records activity (exec, files, sessions) for the idle timeout. */
  touch(id: string, at?: number): Promise<void>;
  /** Moves a sandbox's TTL expiry; the TTL stays the span from creation to it. */
  setExpiry(id: string, ttlSeconds: number, expiresAt: number): Promise<void>;
  /** Running sandboxes whose TTL or idle timeout has passed at `now`. */
  expired(now?: number): Promise<{ id: string; onExpiry: 'stop' | 'pause'; why: string }[]>;
  /** The create request as the caller sent it: what a replay re-creates from. */
  saveSpec(id: string, spec: unknown): Promise<void>;
  spec<T>(id: string): Promise<T | undefined>;
  /** Extends the lease of every create `owner` has in flight (one statement, whatever their number). */
  renewCreates(owner: string, until: number): Promise<number>;
  /** The replica whose create lease a row carries (undefined: none, a row from before create leases). */
  createOwner(id: string): Promise<string | undefined>;
  /** Creates on `edge` some replica still vouches for at `now`: reconcile leaves them to their create. */
  leasedCreates(edge: string, now: number): Promise<Set<string>>;
  /** Creates whose replica stopped renewing their lease before `now` (it died, or lost the store). */
  abandonedCreates(now: number): Promise<{ id: string; edge: string; owner: string }[]>;
  /**
   * Settles a create: the row becomes `status` only while it is still `creating` (another replica
   * may have taken the create over, or the edge been lost, meanwhile). Returns the row's status
   * after the call (undefined: the row is gone).
   */
  settleCreate(id: string, status: SandboxStatus, reason?: string): Promise<SandboxStatus | undefined>;
  /** settleCreate of many, at once: each one's status afterwards, null for a row that is gone. */
  settleCreates(updates: readonly { id: string; status: SandboxStatus; reason?: string }[]): Promise<(SandboxStatus | null)[]>;
  /**
   * insertMany(rows, lease) and settleCreates(updates) in one write (one round trip on
   * PostgreSQL), all or nothing: when it throws, neither part was written.
   */
  insertAndSettle(
    rows: { info: SandboxInfo; batch?: BatchItem; spec: unknown; accessToken?: string }[],
    lease: CreateLease | undefined,
    updates: readonly { id: string; status: SandboxStatus; reason?: string }[],
  ): Promise<(SandboxStatus | null)[]>;
}

export class SqlSandboxRecords implements SandboxRecords {
  constructor(private readonly db: SqlDb) {}

  async insert(s: SandboxInfo, batch?: BatchItem, spec?: unknown, lease?: CreateLease, accessToken?: string): Promise<void> {
    await writeNewSandboxes(this.db, [{ info: s, batch, spec, accessToken }], lease);
  }

  async insertMany(
    rows: { info: SandboxInfo; batch?: BatchItem; spec: unknown; specOnBatch?: boolean; accessToken?: string }[],
    lease?: CreateLease,
  ): Promise<void> {
    await writeNewSandboxes(this.db, rows, lease);
  }

  async get(id: string): Promise<SandboxInfo | undefined> {
    const row = await this.db.get<SandboxRow>(`SELECT ${ROW_COLUMNS} FROM sandboxes WHERE id = ?`, [id]);
    return row && fromRow(row);
  }

  async list(filter: SandboxFilter = {}): Promise<SandboxInfo[]> {
    return (await this.page(filter)).sandboxes;
  }

  /**
   * A page of sandboxes in list order (created_at, id; `order: 'newest'` backwards). With labels,
   * the first pair's rows of the label index (sandbox_labels_page: key, value, created_at, id) are
   * the page, read as one range from the cursor on, and each further pair is a lookup in the same
   * index; without, the sandboxes in created order. Never every row's JSON, never all matches for
   * one page.
   */
  async page(filter: SandboxFilter): Promise<{ sandboxes: SandboxInfo[]; next?: string }> {
    const { rows, next } = await this.#pageRows(filter);
    return next === undefined ? { sandboxes: rows.map(fromRow) } : { sandboxes: rows.map(fromRow), next };
  }

  async pageJson(filter: SandboxFilter): Promise<string> {
    const { rows, next } = await this.#pageRows(filter);
    return sandboxListJson(rows, next);
  }

  async #pageRows(filter: SandboxFilter): Promise<{ rows: SandboxRow[]; next?: string }> {
    const where: string[] = [];
    const params: SqlValue[] = [];
    const [first, ...more] = Object.entries(filter.labels ?? {});
    // The columns the order and the cursor are on: the label rows' copy when a label leads.
    const [at, id] = first ? ['l.created_at', 'l.sandbox_id'] : ['s.created_at', 's.id'];
    const newest = filter.order === 'newest';
    const dir = newest ? ' DESC' : '';
    if (first) {
      where.push('l.key = ? AND l.value = ?');
      params.push(first[0], first[1]);
    }
    for (const [k, v] of more) {
      where.push('s.id IN (SELECT sandbox_id FROM sandbox_labels WHERE key = ? AND value = ?)');
      params.push(k, v);
    }
    if (filter.after) {
      const [createdAt, afterId] = decodeCursor(filter.after);
      // A row value: both engines read it as the start of the index range, where an OR of the
      // two cases was a filter over every entry before the cursor (PostgreSQL).
      where.push(`(${at}, ${id}) ${newest ? '<' : '>'} (?, ?)`);
      params.push(createdAt, afterId);
    }
    if (filter.status) {
      // SQLite has no statistics to choose by: given a project or an edge too, it took the status's
      // index and read every sandbox of that status in the cluster (54–86 ms at 400,000 for a
      // project of 5). The unary + keeps it off that index, on the project's or edge's, which
      // reads that project's or edge's rows in list order. PostgreSQL chooses by its statistics.
      const narrower = filter.project !== undefined || filter.edge !== undefined;
      where.push(narrower && this.db.dialect === 'sqlite' ? '+s.status = ?' : 's.status = ?');
      params.push(filter.status);
    }
    if (filter.edge) {
      where.push('s.edge = ?');
      params.push(filter.edge);
    }
    if (filter.project) {
      where.push('s.project = ?');
      params.push(filter.project);
    }
    const limit = filter.limit;
    const from = first ? 'sandbox_labels l JOIN sandboxes s ON s.id = l.sandbox_id' : 'sandboxes s';
    const sql = `SELECT ${ROW_COLUMNS_S} FROM ${from} ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY ${at}${dir}, ${id}${dir}${limit ? ` LIMIT ${limit + 1}` : ''}`;
    // As arrays, not objects: better-sqlite3 names each row's 19 columns in C++ at a cost that was
    // half of a 1,000-row page's time; the same object built here costs a fraction of it.
    const rows = (await this.db.values(sql, params)).map(rowOfValues);
    if (!limit || rows.length <= limit) return { rows };
    rows.length = limit;
    const last = rows[limit - 1]!;
    return { rows, next: encodeCursor(last.created_at, last.id) };
  }

  async countByStatus(project?: string): Promise<Record<string, number>> {
    await foldCounts(this.db);
    const rows = await this.db.all<{ status: string; n: number }>(
      `SELECT status, SUM(n) AS n FROM sandbox_counts${project === undefined ? '' : ' WHERE project = ?'} GROUP BY status`,
      project === undefined ? [] : [project],
    );
    return Object.fromEntries(rows.filter((r) => Number(r.n) > 0).map((r) => [r.status, Number(r.n)]));
  }

  async countGroups(): Promise<SandboxCount[]> {
    await foldCounts(this.db);
    const rows = await this.db.all<SandboxCount>('SELECT status, edge, project, n AS count FROM sandbox_counts WHERE n > 0');
    return rows.map((r) => ({ ...r, count: Number(r.count) }));
  }

  async foldCounts(): Promise<void> {
    await foldCounts(this.db);
  }

  async accessToken(id: string): Promise<string | undefined> {
    return (await this.db.get<{ t: string | null }>('SELECT access_token AS t FROM sandboxes WHERE id = ?', [id]))?.t ?? undefined;
  }

  async accessTokens(project?: string, runningOnly = false): Promise<Map<string, string>> {
    const rows = await this.db.all<{ id: string; t: string }>(
      `SELECT id, access_token AS t FROM sandboxes WHERE access_token IS NOT NULL${project === undefined ? '' : ' AND project = ?'}${runningOnly ? " AND status = 'running'" : ''}`,
      project === undefined ? [] : [project],
    );
    return new Map(rows.map((r) => [r.id, r.t]));
  }

  async delete(id: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      await tx.run('DELETE FROM trajectory WHERE sandbox_id = ?', [id]);
      await tx.run('DELETE FROM sandboxes WHERE id = ?', [id]);
    });
  }

  async projectOf(id: string): Promise<string | undefined> {
    return (await this.db.get<{ project: string }>('SELECT project FROM sandboxes WHERE id = ?', [id]))?.project;
  }

  async setStatus(id: string, status: SandboxStatus, reason?: string): Promise<void> {
    await this.db.run('UPDATE sandboxes SET status = ?, reason = ? WHERE id = ?', [status, reason ?? null, id]);
  }

  async setStatusIf(id: string, from: SandboxStatus, to: SandboxStatus, reason?: string): Promise<boolean> {
    const { changes } = await this.db.run('UPDATE sandboxes SET status = ?, reason = ? WHERE id = ? AND status = ?', [
      to,
      reason ?? null,
      id,
      from,
    ]);
    return changes === 1;
  }

  async setStatuses(
    updates: { id: string; status: SandboxStatus; reason?: string }[],
  ): Promise<Map<string, { status: SandboxStatus; reason?: string }>> {
    // No row changed: lost meanwhile, taken over by another replica (control/create-leases.ts),
    // or gone altogether (killed); the first two are kept with what they say.
    const others = await settleCreates(this.db, updates);
    const wanted = new Map(updates.map((u) => [u.id, u.status]));
    const kept = new Map<string, { status: SandboxStatus; reason?: string }>();
    for (const [id, now] of others)
      if (now && now.status !== wanted.get(id)) kept.set(id, { status: now.status, ...(now.reason ? { reason: now.reason } : {}) });
    return kept;
  }

  async touch(id: string, at = Date.now()): Promise<void> {
    await this.db.run('UPDATE sandboxes SET last_activity = ? WHERE id = ?', [at, id]);
  }

  async setExpiry(id: string, ttlSeconds: number, expiresAt: number): Promise<void> {
    await this.db.run('UPDATE sandboxes SET ttl_seconds = ?, expires_at = ? WHERE id = ?', [ttlSeconds, expiresAt, id]);
  }

  async expired(now = Date.now()): Promise<{ id: string; onExpiry: 'stop' | 'pause'; why: string }[]> {
    const cols = 'id, on_expiry, expires_at, idle_timeout_seconds, last_activity';
    const rows = await this.db.all<{
      id: string;
      on_expiry: 'stop' | 'pause';
      expires_at: number | null;
      idle_timeout_seconds: number | null;
      last_activity: number;
    }>(
      // One arm per index (sandboxes_expiry, sandboxes_idle): only rows with a TTL or an idle
      // timeout are read, never every running row. UNION drops a row both arms find.
      `SELECT ${cols} FROM sandboxes WHERE status = 'running' AND expires_at IS NOT NULL AND expires_at <= ?
       UNION SELECT ${cols} FROM sandboxes WHERE status = 'running' AND idle_timeout_seconds IS NOT NULL AND last_activity + idle_timeout_seconds * 1000 <= ?
       UNION SELECT ${cols} FROM sandboxes WHERE status = 'paused' AND on_expiry = 'stop' AND expires_at IS NOT NULL AND expires_at <= ?`,
      [now, now, now],
    );
    return rows.map((r) => ({
      id: r.id,
      onExpiry: r.on_expiry,
      why: r.expires_at !== null && r.expires_at <= now ? 'ttl expired' : `idle for ${r.idle_timeout_seconds} s`,
    }));
  }

  async saveSpec(id: string, spec: unknown): Promise<void> {
    await saveSpecRows(this.db, [{ id, spec }]);
  }

  async spec<T>(id: string): Promise<T | undefined> {
    // A batch's item has no row of its own: the spec is its batch's (NewSandboxRow.specOnBatch).
    const row = await this.db.get<{ spec: string | null; batch_spec: string | null }>(
      `SELECT (SELECT spec FROM sandbox_specs WHERE id = ?) AS spec,
         (SELECT b.spec FROM sandboxes s JOIN batches b ON b.id = s.batch_id WHERE s.id = ?) AS batch_spec`,
      [id, id],
    );
    return keptSpec<T>(row);
  }

  async renewCreates(owner: string, until: number): Promise<number> {
    // On PostgreSQL a row another transaction holds is skipped, not waited for: it is a create
    // being settled (store/sandbox-rows.ts settles a group in one UPDATE), which needs no renewal,
    // and waiting made a cycle with that UPDATE, which locks its rows in another order ('deadlock
    // detected', retried, and once in a while a 500 to a create). A skipped row is renewed at the
    // next renewal, a second later, well inside its lease. SQLite has one writer at a time.
    const sql =
      this.db.dialect === 'postgres'
        ? "UPDATE sandboxes SET create_lease_until = ? WHERE id IN (SELECT id FROM sandboxes WHERE create_owner = ? AND status = 'creating' FOR UPDATE SKIP LOCKED)"
        : "UPDATE sandboxes SET create_lease_until = ? WHERE create_owner = ? AND status = 'creating'";
    const { changes } = await this.db.run(sql, [until, owner]);
    return changes;
  }

  async createOwner(id: string): Promise<string | undefined> {
    return (
      (await this.db.get<{ owner: string | null }>('SELECT create_owner AS owner FROM sandboxes WHERE id = ?', [id]))?.owner ?? undefined
    );
  }

  async leasedCreates(edge: string, now: number): Promise<Set<string>> {
    const rows = await this.db.all<{ id: string }>(
      "SELECT id FROM sandboxes WHERE edge = ? AND status = 'creating' AND create_lease_until >= ?",
      [edge, now],
    );
    return new Set(rows.map((r) => r.id));
  }

  async abandonedCreates(now: number): Promise<{ id: string; edge: string; owner: string }[]> {
    return this.db.all<{ id: string; edge: string; owner: string }>(
      "SELECT id, edge, create_owner AS owner FROM sandboxes WHERE status = 'creating' AND create_lease_until IS NOT NULL AND create_lease_until < ? ORDER BY created_at",
      [now],
    );
  }

  async settleCreates(updates: readonly { id: string; status: SandboxStatus; reason?: string }[]): Promise<(SandboxStatus | null)[]> {
    const others = await settleCreates(this.db, updates);
    return updates.map((u) => (others.has(u.id) ? (others.get(u.id)?.status ?? null) : u.status));
  }

  async insertAndSettle(
    rows: { info: SandboxInfo; batch?: BatchItem; spec: unknown; accessToken?: string }[],
    lease: CreateLease | undefined,
    updates: readonly { id: string; status: SandboxStatus; reason?: string }[],
  ): Promise<(SandboxStatus | null)[]> {
    const others = await writeNewAndSettle(this.db, rows, lease, updates);
    return updates.map((u) => (others.has(u.id) ? (others.get(u.id)?.status ?? null) : u.status));
  }

  async settleCreate(id: string, status: SandboxStatus, reason?: string): Promise<SandboxStatus | undefined> {
    const { changes } = await this.db.run("UPDATE sandboxes SET status = ?, reason = ? WHERE id = ? AND status = 'creating'", [
      status,
      reason ?? null,
      id,
    ]);
    if (changes === 1) return status;
    return (await this.db.get<{ status: SandboxStatus }>('SELECT status FROM sandboxes WHERE id = ?', [id]))?.status;
  }
}

/**
 * A sandbox's labels as rows of sandbox_labels, with its created_at (replacing any it had): what
 * a list by label reads, in list order.
 */
export async function saveLabelRows(
  db: Sql,
  id: string,
  labels: Record<string, string>,
  createdAt: string,
  replace = false,
): Promise<void> {
  if (replace) await db.run('DELETE FROM sandbox_labels WHERE sandbox_id = ?', [id]);
  await insertLabelRows(db, [{ id, labels, createdAt }]);
}

/** A page cursor: the last row's (created_at, id), opaque to callers. */
function encodeCursor(createdAt: string, id: string): string {
  return Buffer.from(`${createdAt}\n${id}`).toString('base64url');
}

function decodeCursor(cursor: string): [string, string] {
  const [createdAt, id] = Buffer.from(cursor, 'base64url').toString('utf8').split('\n');
  if (createdAt === undefined || id === undefined)
    throw new ApiError('INVALID_REQUEST', 'after: not a cursor this list gave', { field: 'after' });
  return [createdAt, id];
}

/**
 * Brings sandbox_counts up to date. On SQLite its triggers keep it so as rows change; on
 * PostgreSQL they append to sandbox_count_deltas (no two writers share a row), folded in here:
 * the deltas committed so far are deleted and added to their groups in one statement, so two
 * replicas folding at once each fold a delta at most once, and update the groups in one order.
 */
export async function foldCounts(db: Sql): Promise<void> {
  if (db.dialect !== 'postgres') return;
  await db.run(
    `WITH d AS (DELETE FROM sandbox_count_deltas RETURNING status, edge, project, n, cpu, memory_mib)
     INSERT INTO sandbox_counts (status, edge, project, n, cpu, memory_mib)
       SELECT status, edge, project, SUM(n), SUM(cpu), SUM(memory_mib) FROM d GROUP BY status, edge, project ORDER BY status, edge, project
     ON CONFLICT (status, edge, project) DO UPDATE SET n = sandbox_counts.n + excluded.n, cpu = sandbox_counts.cpu + excluded.cpu,
       memory_mib = sandbox_counts.memory_mib + excluded.memory_mib`,
  );
}

/**
 * A sandbox's kept create request: its spec row's, or for a batch's item (which has none, see
 * NewSandboxRow.specOnBatch) the spec in its batch's stored request (`{count, spec, …}`);
 * undefined when neither has one.
 */
export function keptSpec<T>(row: { spec: string | null; batch_spec: string | null } | undefined): T | undefined {
  if (row?.spec) return JSON.parse(row.spec) as T;
  return row?.batch_spec ? (JSON.parse(row.batch_spec) as { spec?: T }).spec : undefined;
}
