import Database from 'better-sqlite3';
import type { BatchEvent, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import type { EdgeInfo } from '../edge/edge-api.js';

/** An edge as the store keeps it between control-plane restarts. */
export interface StoredEdge {
  id: string;
  url: string;
  pool: string;
  labels: Record<string, string>;
  state: 'ready' | 'draining' | 'lost';
  info: EdgeInfo;
  cpuOvercommit: number;
}

/**
 * The control plane's state in SQLite (better-sqlite3: synchronous, embedded, the fastest SQLite
 * binding for Node; v12 because v13 needs Node 22). WAL with synchronous=NORMAL: a committed
 * transaction survives a process crash, and writers don't block readers.
 */
export class StateStore {
  readonly db: Database.Database;
  /**
   * Statements of the create path, prepared once: preparing costs about as much as running one
   * (measured by `dsec bench cluster`). Only statements run with run()/get() are kept here; those
   * finish synchronously, so one statement is never in use twice (iterate() ones are not cached).
   */
  readonly #statements = new Map<string, Database.Statement>();

  constructor(file: string) {
    this.db = new Database(file);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = NORMAL');
    this.db.pragma('busy_timeout = 5000');
    this.db.pragma('foreign_keys = ON');
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS api_keys (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        created_at TEXT NOT NULL
      );
      CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        edge TEXT NOT NULL,
        status TEXT NOT NULL,
        image TEXT NOT NULL,
        image_id TEXT NOT NULL,
        resources TEXT NOT NULL,
        labels TEXT NOT NULL,
        created_at TEXT NOT NULL,
        reason TEXT
      );
      CREATE INDEX IF NOT EXISTS sandboxes_edge ON sandboxes(edge);
      CREATE INDEX IF NOT EXISTS sandboxes_status ON sandboxes(status);
      CREATE TABLE IF NOT EXISTS sandbox_specs (
        id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
        spec TEXT NOT NULL
      );
      CREATE TABLE IF NOT EXISTS trajectory (
        sandbox_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        request TEXT NOT NULL,
        result TEXT,
        payload BLOB,
        duration_ms REAL,
        exit_code INTEGER,
        replayable INTEGER NOT NULL,
        PRIMARY KEY (sandbox_id, seq)
      );
      CREATE TABLE IF NOT EXISTS edges (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        pool TEXT NOT NULL,
        labels TEXT NOT NULL,
        state TEXT NOT NULL,
        info TEXT NOT NULL,
        cpu_overcommit REAL NOT NULL
      );
      CREATE TABLE IF NOT EXISTS batches (
        id TEXT PRIMARY KEY,
        count INTEGER NOT NULL,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        finished_at TEXT
      );
      CREATE TABLE IF NOT EXISTS batch_events (
        batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        event TEXT NOT NULL,
        PRIMARY KEY (batch_id, seq)
      );
    `);
    this.#migrate();
  }

  /** Columns added after the first release; ALTER TABLE keeps existing state dbs working. */
  #migrate(): void {
    const have = new Set((this.db.prepare('PRAGMA table_info(sandboxes)').all() as { name: string }[]).map((c) => c.name));
    const add: [string, string][] = [
      ['layers', "TEXT NOT NULL DEFAULT '[]'"],
      ['ttl_seconds', 'INTEGER'],
      ['idle_timeout_seconds', 'INTEGER'],
      ['on_expiry', "TEXT NOT NULL DEFAULT 'stop'"],
      ['expires_at', 'INTEGER'],
      ['last_activity', 'INTEGER NOT NULL DEFAULT 0'],
      ['batch_id', 'TEXT'],
      ['batch_index', 'INTEGER'],
      ['backend', "TEXT NOT NULL DEFAULT 'container'"],
      ['trajectory_dropped', 'INTEGER NOT NULL DEFAULT 0'],
    ];
    for (const [col, type] of add) if (!have.has(col)) this.db.exec(`ALTER TABLE sandboxes ADD COLUMN ${col} ${type}`);
    this.db.exec('CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_batch ON sandboxes(batch_id, batch_index) WHERE batch_id IS NOT NULL');
    // Rows an older dsec appended after their sandbox was deleted (the table has no foreign key).
    this.db.exec('DELETE FROM trajectory WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)');
  }

  // --- batches --------------------------------------------------------------------------------

  insertBatch(id: string, count: number, req: unknown, createdAt: string): void {
    this.db.prepare("INSERT INTO batches (id, count, spec, state, created_at) VALUES (?, ?, ?, 'running', ?)").run(id, count, JSON.stringify(req), createdAt);
  }

  getBatch(id: string): StoredBatch | undefined {
    const r = this.db.prepare('SELECT * FROM batches WHERE id = ?').get(id) as BatchRow | undefined;
    return r && fromBatchRow(r);
  }

  listBatches(state?: StoredBatch['state']): StoredBatch[] {
    const rows = (state ? this.db.prepare('SELECT * FROM batches WHERE state = ? ORDER BY created_at').all(state) : this.db.prepare('SELECT * FROM batches ORDER BY created_at').all()) as BatchRow[];
    return rows.map(fromBatchRow);
  }

  finishBatch(id: string, state: 'done' | 'cancelled', at: string): void {
    this.db.prepare('UPDATE batches SET state = ?, finished_at = ? WHERE id = ?').run(state, at, id);
  }

  /** One transaction for many events (a 32,000-sandbox batch makes ~64,000). */
  appendBatchEvents(groups: { id: string; events: { seq: number }[] }[]): void {
    const ins = this.db.prepare('INSERT OR IGNORE INTO batch_events (batch_id, seq, event) VALUES (?, ?, ?)');
    this.db.transaction(() => {
      for (const g of groups) for (const e of g.events) ins.run(g.id, e.seq, JSON.stringify(e));
    })();
  }

  batchEvents(id: string, after: number): BatchEvent[] {
    return (this.db.prepare('SELECT event FROM batch_events WHERE batch_id = ? AND seq > ? ORDER BY seq').all(id, after) as { event: string }[]).map((r) => JSON.parse(r.event) as BatchEvent);
  }

  /** The sandbox rows a batch made, by item index (whatever their status). */
  batchSandboxes(batchId: string): { index: number; id: string }[] {
    return (this.db.prepare('SELECT batch_index AS "index", id FROM sandboxes WHERE batch_id = ?').all(batchId) as { index: number; id: string }[]);
  }

  // --- edges ----------------------------------------------------------------------------------

  upsertEdge(e: StoredEdge): void {
    this.db
      .prepare('INSERT OR REPLACE INTO edges (id, url, pool, labels, state, info, cpu_overcommit) VALUES (?, ?, ?, ?, ?, ?, ?)')
      .run(e.id, e.url, e.pool, JSON.stringify(e.labels), e.state, JSON.stringify(e.info), e.cpuOvercommit);
  }

  listEdges(): StoredEdge[] {
    const rows = this.db.prepare('SELECT * FROM edges').all() as { id: string; url: string; pool: string; labels: string; state: StoredEdge['state']; info: string; cpu_overcommit: number }[];
    return rows.map((r) => ({
      id: r.id,
      url: r.url,
      pool: r.pool,
      labels: JSON.parse(r.labels) as Record<string, string>,
      state: r.state,
      info: JSON.parse(r.info) as EdgeInfo,
      cpuOvercommit: r.cpu_overcommit,
    }));
  }

  deleteEdge(id: string): void {
    this.db.prepare('DELETE FROM edges WHERE id = ?').run(id);
  }

  /** Every live sandbox of a lost edge becomes `lost` with the reason, in one transaction. */
  markEdgeLost(edge: string, reason: string): string[] {
    return this.db.transaction(() => {
      const ids = (this.db.prepare("SELECT id FROM sandboxes WHERE edge = ? AND status IN ('creating', 'running', 'paused')").all(edge) as { id: string }[]).map((r) => r.id);
      this.db.prepare("UPDATE sandboxes SET status = 'lost', reason = ? WHERE edge = ? AND status IN ('creating', 'running', 'paused')").run(reason, edge);
      return ids;
    })();
  }

  close(): void {
    this.db.close();
  }

  #prepared(sql: string): Database.Statement {
    let stmt = this.#statements.get(sql);
    if (!stmt) this.#statements.set(sql, (stmt = this.db.prepare(sql)));
    return stmt;
  }

  // --- API keys -------------------------------------------------------------------------------

  countKeys(): number {
    return (this.db.prepare('SELECT count(*) AS n FROM api_keys').get() as { n: number }).n;
  }

  insertKey(id: string, hash: string, name: string): void {
    this.db.prepare('INSERT INTO api_keys (id, hash, name, created_at) VALUES (?, ?, ?, ?)').run(id, hash, name, new Date().toISOString());
  }

  keyByHash(hash: string): { id: string; name: string } | undefined {
    return this.#prepared('SELECT id, name FROM api_keys WHERE hash = ?').get(hash) as { id: string; name: string } | undefined;
  }

  // --- sandboxes ------------------------------------------------------------------------------

  /**
   * `batch`: the sandbox is item `index` of a batch (unique: a batch never creates an item twice).
   * `spec`: the create request as the caller sent it (saveSpec), written in the same transaction:
   * one commit per create instead of two.
   */
  insertSandbox(s: SandboxInfo, batch?: { id: string; index: number }, spec?: unknown): void {
    if (spec !== undefined) {
      this.db.transaction(() => {
        this.insertSandbox(s, batch);
        this.saveSpec(s.id, spec);
      })();
      return;
    }
    this.#prepared(
        `INSERT INTO sandboxes (id, edge, status, image, image_id, resources, labels, created_at, reason, layers, ttl_seconds, idle_timeout_seconds,
          on_expiry, expires_at, last_activity, batch_id, batch_index, backend) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(
        s.id, s.edge, s.status, s.image, s.imageId, JSON.stringify(s.resources), JSON.stringify(s.labels), s.createdAt, s.reason ?? null,
        JSON.stringify(s.layers), s.ttlSeconds ?? null, s.idleTimeoutSeconds ?? null, s.onExpiry,
        s.expiresAt ? Date.parse(s.expiresAt) : null, Date.parse(s.lastActivityAt), batch?.id ?? null, batch?.index ?? null, s.backend,
      );
  }

  /** Many rows (a batch's group) in one transaction: one commit instead of one per sandbox. */
  insertSandboxes(rows: { info: SandboxInfo; batch?: { id: string; index: number }; spec: unknown }[]): void {
    this.db.transaction(() => {
      for (const r of rows) {
        this.insertSandbox(r.info, r.batch);
        this.saveSpec(r.info.id, r.spec);
      }
    })();
  }

  /**
   * Many status changes in one transaction; a row already `lost` keeps that (its edge went away
   * meanwhile). Returns the ids left unchanged for that reason.
   */
  setStatuses(updates: { id: string; status: SandboxStatus; reason?: string }[]): Set<string> {
    const set = this.#prepared("UPDATE sandboxes SET status = ?, reason = ? WHERE id = ? AND status != 'lost'");
    const statusOf = this.#prepared('SELECT status FROM sandboxes WHERE id = ?');
    const kept = new Set<string>();
    this.db.transaction(() => {
      for (const u of updates) {
        // No row changed: lost meanwhile, or gone altogether (killed); only the first is kept.
        if (set.run(u.status, u.reason ?? null, u.id).changes === 0 && (statusOf.get(u.id) as { status: string } | undefined)?.status === 'lost') kept.add(u.id);
      }
    })();
    return kept;
  }

  /** Records activity (exec, files, sessions) for the idle timeout. */
  touch(id: string, at = Date.now()): void {
    this.db.prepare('UPDATE sandboxes SET last_activity = ? WHERE id = ?').run(at, id);
  }

  /** Moves a sandbox's TTL expiry; the TTL stays the span from creation to it. */
  setExpiry(id: string, ttlSeconds: number, expiresAt: number): void {
    this.db.prepare('UPDATE sandboxes SET ttl_seconds = ?, expires_at = ? WHERE id = ?').run(ttlSeconds, expiresAt, id);
  }

  /** Running sandboxes whose TTL or idle timeout has passed at `now`. */
  expired(now = Date.now()): { id: string; onExpiry: 'stop' | 'pause'; why: string }[] {
    const rows = this.db
      .prepare(
        `SELECT id, on_expiry, expires_at, idle_timeout_seconds, last_activity FROM sandboxes
         WHERE (status = 'running' AND ((expires_at IS NOT NULL AND expires_at <= ?) OR (idle_timeout_seconds IS NOT NULL AND last_activity + idle_timeout_seconds * 1000 <= ?)))
            OR (status = 'paused' AND on_expiry = 'stop' AND expires_at IS NOT NULL AND expires_at <= ?)`,
      )
      .all(now, now, now) as { id: string; on_expiry: 'stop' | 'pause'; expires_at: number | null; idle_timeout_seconds: number | null; last_activity: number }[];
    return rows.map((r) => ({
      id: r.id,
      onExpiry: r.on_expiry,
      why: r.expires_at !== null && r.expires_at <= now ? 'ttl expired' : `idle for ${r.idle_timeout_seconds} s`,
    }));
  }

  /** The create request as the caller sent it: what a replay re-creates from. */
  saveSpec(id: string, spec: unknown): void {
    this.#prepared('INSERT OR REPLACE INTO sandbox_specs (id, spec) VALUES (?, ?)').run(id, JSON.stringify(spec));
  }

  getSpec<T>(id: string): T | undefined {
    const row = this.db.prepare('SELECT spec FROM sandbox_specs WHERE id = ?').get(id) as { spec: string } | undefined;
    return row && (JSON.parse(row.spec) as T);
  }

  setStatus(id: string, status: SandboxStatus, reason?: string): void {
    this.#prepared('UPDATE sandboxes SET status = ?, reason = ? WHERE id = ?').run(status, reason ?? null, id);
  }

  deleteSandbox(id: string): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM trajectory WHERE sandbox_id = ?').run(id);
      this.db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id);
    })();
  }

  getSandbox(id: string): SandboxInfo | undefined {
    const row = this.#prepared('SELECT * FROM sandboxes WHERE id = ?').get(id) as SandboxRow | undefined;
    return row && fromRow(row);
  }

  /** Sandboxes whose labels contain every pair in `labels`, oldest first. */
  listSandboxes(filter: { labels?: Record<string, string>; status?: SandboxStatus; edge?: string } = {}): SandboxInfo[] {
    const where: string[] = [];
    const params: unknown[] = [];
    for (const [k, v] of Object.entries(filter.labels ?? {})) {
      // json_each, not a JSON path built from the key: keys may hold any character.
      where.push('EXISTS (SELECT 1 FROM json_each(sandboxes.labels) WHERE key = ? AND value = ?)');
      params.push(k, v);
    }
    if (filter.status) {
      where.push('status = ?');
      params.push(filter.status);
    }
    if (filter.edge) {
      where.push('edge = ?');
      params.push(filter.edge);
    }
    const sql = `SELECT * FROM sandboxes ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY created_at, id`;
    return (this.db.prepare(sql).all(...params) as SandboxRow[]).map(fromRow);
  }
}

export interface StoredBatch {
  id: string;
  count: number;
  spec: string;
  state: 'running' | 'done' | 'cancelled';
  createdAt: string;
  finishedAt?: string;
}

interface BatchRow {
  id: string;
  count: number;
  spec: string;
  state: StoredBatch['state'];
  created_at: string;
  finished_at: string | null;
}

function fromBatchRow(r: BatchRow): StoredBatch {
  const b: StoredBatch = { id: r.id, count: r.count, spec: r.spec, state: r.state, createdAt: r.created_at };
  if (r.finished_at) b.finishedAt = r.finished_at;
  return b;
}

interface SandboxRow {
  id: string;
  edge: string;
  status: SandboxStatus;
  image: string;
  image_id: string;
  resources: string;
  labels: string;
  created_at: string;
  reason: string | null;
  layers: string;
  ttl_seconds: number | null;
  idle_timeout_seconds: number | null;
  on_expiry: 'stop' | 'pause';
  expires_at: number | null;
  last_activity: number;
  backend: SandboxInfo['backend'];
}

function fromRow(r: SandboxRow): SandboxInfo {
  const info: SandboxInfo = {
    id: r.id,
    edge: r.edge,
    backend: r.backend,
    status: r.status,
    image: r.image,
    imageId: r.image_id,
    resources: JSON.parse(r.resources) as SandboxInfo['resources'],
    labels: JSON.parse(r.labels) as Record<string, string>,
    layers: JSON.parse(r.layers) as string[],
    createdAt: r.created_at,
    onExpiry: r.on_expiry,
    lastActivityAt: new Date(r.last_activity || Date.parse(r.created_at)).toISOString(),
  };
  if (r.reason !== null) info.reason = r.reason;
  if (r.ttl_seconds !== null) info.ttlSeconds = r.ttl_seconds;
  if (r.idle_timeout_seconds !== null) info.idleTimeoutSeconds = r.idle_timeout_seconds;
  if (r.expires_at !== null) info.expiresAt = new Date(r.expires_at).toISOString();
  return info;
}
