import type { SqlValue } from './sql.js';

/**
 * Multi-row statements for the store's group writes (a batch's group of creates, its events). On
 * PostgreSQL each statement is a round trip with node-postgres's work at both ends, whatever its
 * size: a group of 64 creates written a row at a time was ~200 of them (one replica's CPU per
 * create on PostgreSQL fell by a quarter with these, `test/bench/replicas.ts`). A statement's text
 * depends on its number of rows, so rows go in chunks of CHUNK and one remainder: each text is
 * prepared once. 32 rows × 24 columns stays under both engines' limits on parameters (SQLite
 * 32,766, PostgreSQL 65,535).
 */
export const CHUNK = 32;

/**
 * Statement texts by their shape. A group's is thousands of characters (32 rows of 24 columns),
 * built again for every chunk, and the shapes are few (a table's columns, a row count up to
 * CHUNK): each is built once. Bounded all the same, as the prepared statements are.
 */
const texts = new Map<string, string>();

/** The statement text of shape `key` (a string that tells the shapes apart), built by `build` the first time. */
export function statementText(key: string, build: () => string): string {
  let t = texts.get(key);
  if (t === undefined) {
    if (texts.size >= 1_000) texts.clear();
    texts.set(key, (t = build()));
  }
  return t;
}

/** `INSERT INTO table (cols) VALUES (?, …), (?, …)` of `rows` rows, with `suffix` after. */
export function multiInsert(table: string, columns: readonly string[], rows: number, suffix = ''): string {
  return statementText(`${table}(${columns.join()})${rows}${suffix}`, () => {
    const one = `(${columns.map(() => '?').join(', ')})`;
    return `INSERT INTO ${table} (${columns.join(', ')}) VALUES ${Array.from({ length: rows }, () => one).join(', ')}${suffix}`;
  });
}

/** A table's columns split for multiInsertShared: made once per table (sharedInsert), not per group. */
export interface SharedInsert {
  readonly table: string;
  readonly columns: readonly string[];
  /** Indexes of the columns a group's rows may share, bound once. */
  readonly fixed: readonly number[];
  /** Indexes of the columns each row gives its own value. */
  readonly varying: readonly number[];
}

/** `table`'s `columns`, all but the `varying` ones bound once per group when its rows agree on them. */
export function sharedInsert(table: string, columns: readonly string[], varying: ReadonlySet<string>): SharedInsert {
  const split: { fixed: number[]; varying: number[] } = { fixed: [], varying: [] };
  for (let c = 0; c < columns.length; c++) (varying.has(columns[c]!) ? split.varying : split.fixed).push(c);
  return { table, columns, ...split };
}

/**
 * A multi-row INSERT of `rows` (each a value per column) with the shared columns bound once when
 * every row gives each of them the same value: `INSERT INTO t (others…, shared…) SELECT v.*, ?, …
 * FROM (VALUES (?, …), …) v`; else multiInsert's statement. A group's rows share most of their
 * columns (a batch's: all but the id, the edge, the times and the index), and binding each value
 * costs the binding's work on both sides: a group of 32 sandbox rows took ~13 % less CPU to insert
 * with its 19 shared columns bound once (SQLite, the store's own schema). The shared columns are
 * the caller's (sharedInsert), not found per group, so a group's statement is one of two texts for
 * its size (each prepared once). The values keep their order and their columns' affinity.
 */
export function multiInsertShared(insert: SharedInsert, rows: readonly (readonly SqlValue[])[]): { sql: string; params: SqlValue[] } {
  const { table, columns, fixed, varying } = insert;
  const first = rows[0]!;
  let same = rows.length > 1 && fixed.length > 0 && varying.length > 0;
  for (let i = 1; same && i < rows.length; i++) {
    const r = rows[i]!;
    for (const c of fixed)
      if (r[c] !== first[c]) {
        same = false;
        break;
      }
  }
  if (!same) return { sql: multiInsert(table, columns, rows.length), params: flatValues(rows, (r) => r) };
  const sql = statementText(`${table}(${columns.join()})${rows.length}/${fixed.join()}`, () => {
    const one = `(${varying.map(() => '?').join(', ')})`;
    return (
      `INSERT INTO ${table} (${[...varying, ...fixed].map((c) => columns[c]).join(', ')}) ` +
      `SELECT v.*, ${fixed.map(() => '?').join(', ')} FROM (VALUES ${Array.from({ length: rows.length }, () => one).join(', ')}) v`
    );
  });
  // The shared values first: parameters are numbered in the order they appear in the text.
  const params: SqlValue[] = [];
  for (const c of fixed) params.push(first[c]!);
  for (const r of rows) for (const c of varying) params.push(r[c]!);
  return { sql, params };
}

/** `each` of every chunk of at most CHUNK items, one after another. */
export async function chunked<T>(items: readonly T[], each: (chunk: readonly T[]) => Promise<unknown>): Promise<void> {
  for (let i = 0; i < items.length; i += CHUNK) await each(items.slice(i, i + CHUNK));
}

/**
 * The parameters of a multi-row statement: each item's values, one after another. A loop of
 * pushes, not flatMap, which V8 runs several times slower on arrays this size: flatMap building a
 * group's sandbox rows was 2 % of the control plane's time placing a batch (dsec bench cluster).
 */
export function flatValues<T, V>(items: readonly T[], values: (item: T) => readonly V[]): V[] {
  const out: V[] = [];
  for (const item of items) for (const v of values(item)) out.push(v);
  return out;
}

/**
 * JSON.stringify for the rows of one group, each object serialized once: a batch's rows share
 * their resources and layers objects (found by identity, so an object must not change while the
 * group is written).
 */
export function jsonOnce(): (value: unknown) => string {
  const texts = new Map<unknown, string>();
  return (value) => {
    let text = texts.get(value);
    if (text === undefined) texts.set(value, (text = JSON.stringify(value)));
    return text;
  };
}
