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
