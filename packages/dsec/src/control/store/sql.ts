/**
 * The SQL engine under the control plane's state store: SQLite (embedded, the default) or
 * PostgreSQL (shared by several control-plane replicas). Statements are written once, in SQL both
 * engines run (`?` placeholders, `INSERT ... ON CONFLICT`, no engine-only functions); where the
 * engines truly differ a caller branches on `dialect`.
 */
export type Dialect = 'sqlite' | 'postgres';

/** A parameter value: both engines take these as they are. */
export type SqlValue = string | number | bigint | boolean | null | Buffer;

/** Something statements run on: the engine itself, or one open transaction on it. */
export interface Sql {
  readonly dialect: Dialect;
  /** Every row of a query. */
  all<T>(sql: string, params?: readonly SqlValue[]): Promise<T[]>;
  /**
   * Every row of a query as an array of its columns in the order selected: no object with named
   * properties per row. For reads of many rows: a page of 1,000 sandboxes took half the time.
   */
  values(sql: string, params?: readonly SqlValue[]): Promise<unknown[][]>;
  /** The first row of a query, if any. */
  get<T>(sql: string, params?: readonly SqlValue[]): Promise<T | undefined>;
  /** A statement's effect: how many rows it changed. */
  run(sql: string, params?: readonly SqlValue[]): Promise<{ changes: number }>;
  /** Runs a script of several statements without parameters (migrations). */
  exec(script: string): Promise<void>;
}

export interface SqlDb extends Sql {
  /**
   * Runs `fn` in one transaction: committed when it resolves, rolled back when it throws. Inside,
   * run statements on `tx` only (the engine itself waits for the transaction to end).
   */
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

/**
 * A WHERE clause for "the JSON object in `column` holds every pair of `labels`" (one condition
 * per pair, to be ANDed), with its parameters. The engine's JSON functions, not a JSON path built
 * from the key: keys may hold any character. A NULL column matches no pair.
 */
export function labelsMatch(dialect: Dialect, column: string, labels: Record<string, string>): { where: string[]; params: SqlValue[] } {
  const where: string[] = [];
  const params: SqlValue[] = [];
  for (const [k, v] of Object.entries(labels)) {
    where.push(
      dialect === 'postgres'
        ? `CAST(${column} AS jsonb) ->> CAST(? AS text) = ?`
        : `EXISTS (SELECT 1 FROM json_each(${column}) WHERE key = ? AND value = ?)`,
    );
    params.push(k, v);
  }
  return { where, params };
}
