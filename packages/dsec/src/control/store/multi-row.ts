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

/** `INSERT INTO table (cols) VALUES (?, …), (?, …)` of `rows` rows, with `suffix` after. */
export function multiInsert(table: string, columns: readonly string[], rows: number, suffix = ''): string {
  const one = `(${columns.map(() => '?').join(', ')})`;
  return `INSERT INTO ${table} (${columns.join(', ')}) VALUES ${Array.from({ length: rows }, () => one).join(', ')}${suffix}`;
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
