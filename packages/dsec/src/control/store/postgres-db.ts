import pg from 'pg';
import type { Sql, SqlDb, SqlValue } from './sql.js';

/** PostgreSQL's oid for int8 (count(*), BIGINT columns): read as a number, as SQLite gives it. */
const INT8_OID = 20;

/**
 * PostgreSQL through `pg` (node-postgres: the most used client, pure JavaScript, a connection
 * pool, per-connection prepared statements and type parsers), behind the async SqlDb interface.
 * Statements arrive with `?` placeholders and are sent with PostgreSQL's `$1`, `$2`, ...
 */
export class PostgresDb implements SqlDb {
  readonly dialect = 'postgres' as const;
  readonly #pool: pg.Pool;
  /** Each statement's PostgreSQL text and prepared-statement name, made once. */
  readonly #statements = new Map<string, { name: string; text: string }>();

  constructor(url: string, opts: { maxConnections?: number; onError?: (err: Error) => void } = {}) {
    this.#pool = new pg.Pool({
      ...withoutParallelQuery(url),
      max: opts.maxConnections ?? 10,
      types: {
        getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
          oid === INT8_OID ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
      },
    });
    // An idle connection that breaks (the server restarted) is dropped by the pool; the next query opens another.
    this.#pool.on('error', (err) => opts.onError?.(err));
  }

  all<T>(sql: string, params?: readonly SqlValue[]): Promise<T[]> {
    return retried(() => this.#all<T>(this.#pool, sql, params));
  }

  async get<T>(sql: string, params?: readonly SqlValue[]): Promise<T | undefined> {
    return (await retried(() => this.#all<T>(this.#pool, sql, params)))[0];
  }

  values(sql: string, params?: readonly SqlValue[]): Promise<unknown[][]> {
    return retried(() => this.#values(this.#pool, sql, params));
  }

  run(sql: string, params?: readonly SqlValue[]): Promise<{ changes: number }> {
    return retried(() => this.#run(this.#pool, sql, params));
  }

  async exec(script: string): Promise<void> {
    await this.#pool.query(script);
  }

  /**
   * `fn` in a transaction; run again from the start (at most MAX_TRIES times) when PostgreSQL
   * aborts it as a deadlock's victim or for a serialization failure, as it asks clients to: two
   * transactions that each update several sandbox rows (a batch of creates marked running, the
   * create leases renewed) can lock them in opposite orders. `fn` must only touch the database
   * through `tx` (nothing else is undone by the rollback).
   */
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return retried(() => this.#transactionOnce(fn));
  }

  async #transactionOnce<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    const client = await this.#pool.connect();
    const tx: Sql = {
      dialect: this.dialect,
      all: <T>(sql: string, params?: readonly SqlValue[]) => this.#all<T>(client, sql, params),
      get: async <T>(sql: string, params?: readonly SqlValue[]) => (await this.#all<T>(client, sql, params))[0],
      values: (sql: string, params?: readonly SqlValue[]) => this.#values(client, sql, params),
      run: (sql, params) => this.#run(client, sql, params),
      exec: async (script) => void (await client.query(script)),
    };
    let broken: Error | undefined;
    try {
      await client.query('BEGIN');
      const result = await fn(tx);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch((e: unknown) => (broken = e as Error));
      throw err;
    } finally {
      // A connection that could not roll back is closed rather than handed to the next caller.
      client.release(broken);
    }
  }

  async close(): Promise<void> {
    await this.#pool.end();
  }

  async #all<T>(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlValue[] = []): Promise<T[]> {
    return (await on.query(this.#statement(sql, params))).rows as T[];
  }

  async #values(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlValue[] = []): Promise<unknown[][]> {
    return (await on.query({ ...this.#statement(sql, params), rowMode: 'array' })).rows as unknown[][];
  }

  async #run(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlValue[] = []): Promise<{ changes: number }> {
    return { changes: (await on.query(this.#statement(sql, params))).rowCount ?? 0 };
  }

  #statement(sql: string, params: readonly SqlValue[]): pg.QueryConfig {
    let s = this.#statements.get(sql);
    if (!s) this.#statements.set(sql, (s = { name: `dsec-${this.#statements.size}`, text: numberPlaceholders(sql) }));
    return {
      name: s.name,
      text: s.text,
      values: params.map((p) => (typeof p === 'boolean' ? (p ? 1 : 0) : typeof p === 'bigint' ? p.toString() : p)),
    };
  }
}

/** SQLSTATEs after which PostgreSQL expects the transaction to be tried again: deadlock victim, serialization failure. */
const RETRY_CODES = new Set(['40P01', '40001']);
const MAX_TRIES = 5;

/** `attempt` again on a deadlock or serialization failure, after a short jittered wait (2, 4, 8, 16 ms and up). */
async function retried<T>(attempt: () => Promise<T>): Promise<T> {
  for (let tries = 1; ; tries++) {
    try {
      return await attempt();
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (tries >= MAX_TRIES || typeof code !== 'string' || !RETRY_CODES.has(code)) throw err;
      await new Promise((r) => setTimeout(r, (1 << tries) * (1 + Math.random())));
    }
  }
}

/** `?` → `$1`, `$2`, ... outside quoted strings, quoted identifiers and comments. */
export function numberPlaceholders(sql: string): string {
  let out = '';
  let n = 0;
  for (let i = 0; i < sql.length; i++) {
    const c = sql[i]!;
    if (c === "'" || c === '"') {
      const end = sql.indexOf(c, i + 1);
      const stop = end === -1 ? sql.length : end + 1;
      out += sql.slice(i, stop);
      i = stop - 1;
    } else if (c === '-' && sql[i + 1] === '-') {
      const end = sql.indexOf('\n', i);
      const stop = end === -1 ? sql.length : end;
      out += sql.slice(i, stop);
      i = stop - 1;
    } else if (c === '?') {
      out += `$${++n}`;
    } else {
      out += c;
    }
  }
  return out;
}

/**
 * The connection's settings: the URL without its `options`, and those options (if any) with
 * parallel query off. The control plane's statements are short reads and writes by index; for a
 * page of 1,000 sandboxes by label the planner chose a parallel plan whose two workers took longer
 * to start than the page took to read (EXPLAIN ANALYZE at 400,000 rows: 14–21 ms against 4–6 ms
 * without workers). The URL's `options` are taken out because pg lets the URL's override the config's.
 */
function withoutParallelQuery(url: string): { connectionString: string; options: string } {
  const off = '-c max_parallel_workers_per_gather=0';
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return { connectionString: url, options: off }; // not a URL the WHATWG parser reads (pg reads more)
  }
  const own = parsed.searchParams.get('options');
  if (own === null) return { connectionString: url, options: off };
  parsed.searchParams.delete('options');
  return { connectionString: parsed.toString(), options: `${own} ${off}` };
}
