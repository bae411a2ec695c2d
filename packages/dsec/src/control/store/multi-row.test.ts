import assert from 'node:assert/strict';
import { test } from 'node:test';
import { multiInsert, multiInsertShared, sharedInsert } from './multi-row.js';
import type { SqlValue } from './sql.js';
import { SqliteDb } from './sqlite-db.js';

const COLUMNS = ['id', 'kind', 'size', 'note', 'at'] as const;
const INSERT = sharedInsert('t', COLUMNS, new Set(['id', 'at']));

async function table(): Promise<SqliteDb> {
  const db = new SqliteDb(':memory:');
  await db.exec('CREATE TABLE t (id TEXT PRIMARY KEY, kind TEXT NOT NULL, size REAL, note TEXT, at INTEGER NOT NULL)');
  return db;
}

/**
 * The shared columns bound once give the same rows, in the same order and with the same types,
 * as every value bound (multiInsert); a group whose rows differ in a shared column, or of one
 * row, is multiInsert's statement.
 */
test('multiInsertShared: shared columns bound once write the rows multiInsert writes', async () => {
  const rows: SqlValue[][] = [
    ['a', 'busybox', 0.5, null, 3],
    ['b', 'busybox', 0.5, null, 1],
    ['c', 'busybox', 0.5, null, 2],
  ];
  const shared = multiInsertShared(INSERT, rows);
  assert.match(
    shared.sql,
    /^INSERT INTO t \(id, at, kind, size, note\) SELECT v\.\*, \?, \?, \? FROM \(VALUES \(\?, \?\), \(\?, \?\), \(\?, \?\)\) v$/,
  );
  assert.deepEqual(shared.params, ['busybox', 0.5, null, 'a', 3, 'b', 1, 'c', 2]);

  const one = await table();
  const other = await table();
  try {
    await one.run(shared.sql, shared.params);
    await other.run(
      multiInsert('t', COLUMNS, rows.length),
      rows.flatMap((r) => r),
    );
    const read = (db: SqliteDb): Promise<unknown[]> =>
      db.all('SELECT rowid, id, kind, size, typeof(size) AS st, note, at, typeof(at) AS at_type FROM t ORDER BY rowid');
    assert.deepEqual(await read(one), await read(other));
    assert.equal(((await read(one))[0] as { st: string }).st, 'real');
  } finally {
    await one.close();
    await other.close();
  }

  const differing = multiInsertShared(INSERT, [rows[0]!, ['d', 'alpine', 0.5, null, 4]]);
  assert.equal(differing.sql, multiInsert('t', COLUMNS, 2));
  assert.deepEqual(differing.params, [...rows[0]!, 'd', 'alpine', 0.5, null, 4]);
  assert.equal(multiInsertShared(INSERT, [rows[0]!]).sql, multiInsert('t', COLUMNS, 1));
});
