import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { postgresSkipReason, testPostgres } from '../../../test/helpers/postgres.js';
import { PostgresDb } from './postgres-db.js';

/**
 * The control plane's connections to PostgreSQL: parallel query off (a page of 1,000 sandboxes by
 * label took 14–21 ms with the two workers the planner chose, 4–6 ms without), and whatever
 * options the operator's URL sets kept beside it.
 */
describe('PostgreSQL connections', { skip: postgresSkipReason() }, () => {
  const dbs: PostgresDb[] = [];
  after(async () => {
    for (const db of dbs) await db.close();
  });

  test('run without parallel workers, keeping the options of the URL', async () => {
    const url = await (await testPostgres()).database('dsec_connection_options');
    const plain = new PostgresDb(url);
    const withOwn = new PostgresDb(`${url}?options=${encodeURIComponent('-c statement_timeout=4321')}`);
    dbs.push(plain, withOwn);
    const setting = async (db: PostgresDb, name: string): Promise<string | undefined> =>
      (await db.get<{ v: string }>(`SELECT current_setting('${name}') AS v`))?.v;
    assert.equal(await setting(plain, 'max_parallel_workers_per_gather'), '0');
    assert.equal(await setting(withOwn, 'max_parallel_workers_per_gather'), '0');
    assert.equal(await setting(withOwn, 'statement_timeout'), '4321ms');
    assert.notEqual(await setting(plain, 'statement_timeout'), '4321ms');
  });
});
