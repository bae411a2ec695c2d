import { chmodSync, existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import type { Sql, SqlDb, SqlValue } from './sql.js';
import { BACKSTOP_PAGES, SqliteCheckpointer } from './sqlite-checkpointer.js';

/** Prepared statements kept; past this the cache starts over (statements built per filter vary). */
const MAX_CACHED_STATEMENTS = 500;

/**
 * Statements run by every SqliteDb of this process (any connection), counted as they start:
 * SqliteChangeFeed's check of data_version stands only while no other connection ran one since
 * (sqliteStatements less the connection's own, SqliteDb.statements).
 */
let statements = 0;

/** How many statements this process's SQLite connections have run (see `statements`). */
export function sqliteStatements(): number {
  return statements;
}

/**
 * SQLite through better-sqlite3 (synchronous, embedded, the fastest SQLite binding for Node; v12
 * because v13 needs Node 22), behind the async SqlDb interface. WAL with synchronous=NORMAL: a
 * committed transaction survives a process crash, and writers don't block readers.
 *
 * One connection serves everything, so a transaction that awaits between its statements would
 * take in whatever else ran meanwhile: while one is open, statements outside it wait for its end.
 */
export class SqliteDb implements SqlDb {
  readonly dialect = 'sqlite' as const;
  readonly #db: Database.Database;
  /**
   * Statements prepared once: preparing costs about as much as running one (measured by `dsec
   * bench cluster`). all/get/run finish synchronously, so one statement is never in use twice.
   * `values` keeps statements of its own (raw mode is a statement's state).
   */
  readonly #statements = new Map<string, Database.Statement>();
  readonly #rawStatements = new Map<string, Database.Statement>();
  /** Settles when the open transaction ends; undefined when none is open. */
  #open: Promise<void> | undefined;
  /** The open transaction's own view, which runs at once. */
  readonly #direct: Sql;
  /** Checkpoints off the event loop (sqlite-checkpointer.ts); none for an in-memory database. */
  readonly #checkpointer: SqliteCheckpointer | undefined;
  /** `PRAGMA data_version`, prepared once (dataVersion). */
  readonly #dataVersion: Database.Statement;
  /** Statements this connection ran (of `statements`, every connection's). */
  #own = 0;

  constructor(file: string) {
    this.#db = new Database(file);
    // The store holds secrets (the cluster token, E2B sandboxes' access tokens, trajectories):
    // the owner's only. SQLite makes its -wal and -shm with the database file's mode; ones left
    // by an older dsec are narrowed too.
    if (file !== ':memory:') for (const f of [file, `${file}-wal`, `${file}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
    // The busy timeout first: the journal-mode pragma itself may meet another connection's lock
    // (a second process on a live server's store, as the CLI's tools and tests open it), and
    // without a timeout that is SQLITE_BUSY at once.
    this.#db.pragma('busy_timeout = 5000');
    this.#db.pragma('journal_mode = WAL');
    this.#db.pragma('synchronous = NORMAL');
    this.#db.pragma('foreign_keys = ON');
    // SQLite's own default page cache (2,048,000 bytes), not better-sqlite3's 16,000 KiB: the cache
    // fills as the state database grows (ended sandboxes' rows and trajectories stay for their
    // retention), which a long-running dsec shows as resident memory that only grows (half of its
    // RSS growth over a 3,000-cycle soak: +26.2 MiB anonymous with 16 MB, +13.3 with 2 MB). The
    // rows a request touches are few and recent, and the kernel's page cache keeps the file.
    this.#db.pragma('cache_size = -2000');
    // Temporary tables, indexes and statement journals in memory, not in files: a multi-row
    // INSERT with a trigger and an upsert, or the settles' UPDATE … FROM (SELECT … UNION ALL …),
    // opened, wrote and unlinked a file of its own, several system calls per statement. A group of
    // 8 creates' writes cost 20 % less CPU without them (`dsec bench cluster`'s store writes,
    // docs/BENCHMARKS.md). The store's reads are paged and go by its indexes, so no sort of a whole
    // table lands here.
    this.#db.pragma('temp_store = MEMORY');
    if (file !== ':memory:') {
      this.#db.pragma(`wal_autocheckpoint = ${BACKSTOP_PAGES}`);
      this.#checkpointer = SqliteCheckpointer.start(file);
    }
    this.#dataVersion = this.#db.prepare('PRAGMA data_version').pluck();
    this.#direct = {
      dialect: this.dialect,
      all: async <T>(sql: string, params: readonly SqlValue[] = []) => (this.#count(), this.#prepared(sql).all(...bind(params)) as T[]),
      values: async (sql: string, params: readonly SqlValue[] = []) => (
        this.#count(),
        this.#prepared(sql, true).all(...bind(params)) as unknown[][]
      ),
      get: async <T>(sql: string, params: readonly SqlValue[] = []) => (
        this.#count(),
        this.#prepared(sql).get(...bind(params)) as T | undefined
      ),
      run: async (sql: string, params: readonly SqlValue[] = []) => (
        this.#count(),
        { changes: this.#prepared(sql).run(...bind(params)).changes }
      ),
      exec: async (script: string) => (this.#count(), void this.#db.exec(script)),
    };
  }

  async all<T>(sql: string, params?: readonly SqlValue[]): Promise<T[]> {
    while (this.#open) await this.#open;
    return this.#direct.all<T>(sql, params);
  }

  async values(sql: string, params?: readonly SqlValue[]): Promise<unknown[][]> {
    while (this.#open) await this.#open;
    return this.#direct.values(sql, params);
  }

  async get<T>(sql: string, params?: readonly SqlValue[]): Promise<T | undefined> {
    while (this.#open) await this.#open;
    return this.#direct.get<T>(sql, params);
  }

  async run(sql: string, params?: readonly SqlValue[]): Promise<{ changes: number }> {
    while (this.#open) await this.#open;
    return this.#direct.run(sql, params);
  }

  async exec(script: string): Promise<void> {
    while (this.#open) await this.#open;
    return this.#direct.exec(script);
  }

  async transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    while (this.#open) await this.#open;
    let end!: () => void;
    this.#open = new Promise((resolve) => (end = resolve));
    try {
      // IMMEDIATE takes the write lock up front: a deferred one upgrading later can fail busy.
      this.#count();
      this.#db.exec('BEGIN IMMEDIATE');
      try {
        const result = await fn(this.#direct);
        this.#count();
        this.#db.exec('COMMIT');
        return result;
      } catch (err) {
        if (this.#db.inTransaction) this.#db.exec('ROLLBACK');
        throw err;
      }
    } finally {
      this.#open = undefined;
      end();
    }
  }

  /**
   * SQLite's count of commits made by other connections to this database (another process, such
   * as the CLI's tools on a live server's store, or another connection in this one): it changes
   * whenever one of them committed since it was last asked, and never for this connection's own
   * commits. Synchronous, no table read (it begins a read transaction, as any statement does): what
   * SqliteChangeFeed looks at.
   */
  dataVersion(): number {
    return this.#dataVersion.get() as number;
  }

  /** How many statements this connection has run: those of the process's others are sqliteStatements() less these. */
  get statements(): number {
    return this.#own;
  }

  #count(): void {
    statements++;
    this.#own++;
  }

  async close(): Promise<void> {
    while (this.#open) await this.#open;
    await this.#checkpointer?.close();
    this.#db.close();
  }

  #prepared(sql: string, raw = false): Database.Statement {
    const cache = raw ? this.#rawStatements : this.#statements;
    let stmt = cache.get(sql);
    if (!stmt) {
      if (cache.size >= MAX_CACHED_STATEMENTS) cache.clear();
      cache.set(sql, (stmt = this.#db.prepare(sql)));
      if (raw) stmt.raw(true);
    }
    return stmt;
  }
}

/** better-sqlite3 takes no booleans: they are stored as 1 and 0, as PostgreSQL's adapter does. */
function bind(params: readonly SqlValue[]): unknown[] {
  return params.map((p) => (typeof p === 'boolean' ? (p ? 1 : 0) : p));
}
