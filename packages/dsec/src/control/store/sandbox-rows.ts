import type { SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { chunked, flatValues, jsonOnce, multiInsert, multiInsertShared, sharedInsert, statementText } from './multi-row.js';
import type { Sql, SqlDb, SqlValue } from './sql.js';

/** Which item of which batch a sandbox is. */
export interface BatchItem {
  id: string;
  index: number;
}

/** The replica creating a sandbox and until when it vouches for the create (renewed while it runs). */
export interface CreateLease {
  owner: string;
  until: number;
}

export interface NewSandboxRow {
  info: SandboxInfo;
  batch?: BatchItem | undefined;
  /** The create request as the caller sent it (undefined: none kept). */
  spec?: unknown;
  /**
   * The spec is its batch's, kept on the batch's row (SandboxRecords.spec reads it there): no row
   * of its own. A batch of 32,000 wrote 32,000 copies of one spec.
   */
  specOnBatch?: boolean | undefined;
  accessToken?: string | undefined;
}

const SANDBOX_COLUMNS = [
  'id',
  'edge',
  'status',
  'image',
  'image_id',
  'resources',
  'labels',
  'created_at',
  'reason',
  'layers',
  'ttl_seconds',
  'idle_timeout_seconds',
  'on_expiry',
  'expires_at',
  'last_activity',
  'batch_id',
  'batch_index',
  'backend',
  'project',
  'cpu',
  'memory_mib',
  'create_owner',
  'create_lease_until',
  'access_token',
] as const;

/**
 * A group's sandbox rows, with the columns they usually all give the same value (one spec, one
 * project, one write's lease) bound once per statement when they do (multiInsertShared). These
 * differ from row to row: ids, edges, times and batch indexes, and an expiry time and an E2B
 * access token where there are any.
 */
const SANDBOX_INSERT = sharedInsert(
  'sandboxes',
  SANDBOX_COLUMNS,
  new Set<(typeof SANDBOX_COLUMNS)[number]>(['id', 'edge', 'created_at', 'expires_at', 'last_activity', 'batch_index', 'access_token']),
);

function sandboxValues(r: NewSandboxRow, lease: CreateLease | undefined, json: (value: object) => string = JSON.stringify): SqlValue[] {
  const s = r.info;
  return [
    s.id,
    s.edge,
    s.status,
    s.image,
    s.imageId,
    json(s.resources),
    JSON.stringify(s.labels),
    s.createdAt,
    s.reason ?? null,
    json(s.layers),
    s.ttlSeconds ?? null,
    s.idleTimeoutSeconds ?? null,
    s.onExpiry,
    s.expiresAt ? Date.parse(s.expiresAt) : null,
    Date.parse(s.lastActivityAt),
    r.batch?.id ?? null,
    r.batch?.index ?? null,
    s.backend,
    s.project ?? DEFAULT_PROJECT,
    s.resources.cpu,
    s.resources.memoryMiB,
    lease?.owner ?? null,
    lease?.until ?? null,
    r.accessToken ?? null,
  ];
}

/**
 * New sandbox rows with their labels, specs and volume mounts, all or none. SQLite: the
 * multi-row statements of insertSandboxRows in one transaction (a transaction costs an embedded
 * engine nothing). PostgreSQL: one statement whatever the group's size, since there every
 * statement, and the BEGIN and COMMIT around them, is a round trip (a socket write and a wake-up
 * of the server at each end: most of a replica's CPU per create, `test/bench/replicas.ts`).
 */
export async function writeNewSandboxes(db: SqlDb, rows: readonly NewSandboxRow[], lease?: CreateLease): Promise<void> {
  if (db.dialect === 'sqlite') return db.transaction((tx) => insertSandboxRows(tx, rows, lease));
  await db.run(`WITH ${NEW_ROWS_WITH} ${NEW_MOUNTS_INSERT}`, newRowsParams(rows, lease));
}

/**
 * New rows (writeNewSandboxes) and settles (settleCreates) in one write: what a turn of single
 * creates asks of the store, the inserts of the creates that came and the settles of those their
 * edges answered. SQLite: one transaction. PostgreSQL: one statement (the settles' UPDATE one
 * more WITH clause; it sees the rows as they were before the statement, and a settled row was
 * written by an earlier one), one round trip where there were two: with two replicas each forms
 * smaller groups, and each group's round trips were most of the CPU the second replica added
 * (`test/bench/replicas.ts`). All or nothing: when it fails, neither part was written.
 */
export async function writeNewAndSettle(
  db: SqlDb,
  rows: readonly NewSandboxRow[],
  lease: CreateLease | undefined,
  updates: readonly Settle[],
): Promise<SettledElsewhere> {
  const others: SettledElsewhere = new Map();
  if (db.dialect === 'sqlite') {
    await db.transaction(async (tx) => {
      await insertSandboxRows(tx, rows, lease);
      await chunked(updates, (c) => settleChunk(tx, c, others));
    });
    return others;
  }
  const changed = await db.all<{ id: string }>(
    `WITH ${NEW_ROWS_WITH}, v AS (${NEW_MOUNTS_INSERT}), settled AS (${SETTLE_UPDATE}) SELECT id FROM settled`,
    [...newRowsParams(rows, lease), settleParam(updates)],
  );
  if (changed.length < updates.length) await readOthers(db, updates, changed, others);
  return others;
}

/**
 * PostgreSQL: each table's rows are one JSON parameter that json_populate_recordset reads as rows
 * of the table's own type, so the text is the same for any number of rows (prepared once), and
 * the data-modifying WITH clauses make the inserts one statement: atomic without a transaction
 * (the foreign keys are checked at the statement's end, when the sandboxes' rows are in).
 */
const NEW_ROWS_WITH = `s AS (INSERT INTO sandboxes (${SANDBOX_COLUMNS.join(', ')})
        SELECT ${SANDBOX_COLUMNS.join(', ')} FROM json_populate_recordset(NULL::sandboxes, ?::json)),
      l AS (INSERT INTO sandbox_labels (sandbox_id, key, value, created_at)
        SELECT sandbox_id, key, value, created_at FROM json_populate_recordset(NULL::sandbox_labels, ?::json)),
      p AS (INSERT INTO sandbox_specs (id, spec) SELECT id, spec FROM json_populate_recordset(NULL::sandbox_specs, ?::json)
        ON CONFLICT (id) DO UPDATE SET spec = excluded.spec)`;
const NEW_MOUNTS_INSERT = `INSERT INTO volume_mounts (volume, sandbox_id) SELECT volume, sandbox_id FROM json_populate_recordset(NULL::volume_mounts, ?::json)
      ON CONFLICT DO NOTHING`;

/** The four JSON parameters of NEW_ROWS_WITH and NEW_MOUNTS_INSERT. */
function newRowsParams(rows: readonly NewSandboxRow[], lease: CreateLease | undefined): string[] {
  const json = jsonOnce();
  const sandboxes = rows.map((r) => {
    const values = sandboxValues(r, lease, json);
    return Object.fromEntries(SANDBOX_COLUMNS.map((c, i) => [c, values[i]]));
  });
  const labels = rows.flatMap((r) =>
    Object.entries(r.info.labels).map(([key, value]) => ({ sandbox_id: r.info.id, key, value, created_at: r.info.createdAt })),
  );
  const specs = specRows(specsOf(rows));
  return [
    JSON.stringify(sandboxes),
    JSON.stringify(labels),
    JSON.stringify(specs.texts.map(([id, spec]) => ({ id, spec }))),
    JSON.stringify(specs.mounts.map(([volume, sandbox_id]) => ({ volume, sandbox_id }))),
  ];
}

/**
 * New sandbox rows with their labels (sandbox_labels, in list order by created_at) and specs
 * (saveSpecRows): a few multi-row statements per table instead of several per sandbox.
 * Run it inside a transaction.
 */
async function insertSandboxRows(tx: Sql, rows: readonly NewSandboxRow[], lease?: CreateLease): Promise<void> {
  const json = jsonOnce();
  await chunked(rows, (c) => {
    const { sql, params } = multiInsertShared(
      SANDBOX_INSERT,
      c.map((r) => sandboxValues(r, lease, json)),
    );
    return tx.run(sql, params);
  });
  await insertLabelRows(
    tx,
    rows.map((r) => ({ id: r.info.id, labels: r.info.labels, createdAt: r.info.createdAt })),
  );
  await saveSpecRows(tx, specsOf(rows));
}

/** The specs of new rows, for specRows. */
function specsOf(rows: readonly NewSandboxRow[]): SpecRow[] {
  return rows.filter((r) => r.spec !== undefined).map((r) => ({ id: r.info.id, spec: r.spec, onBatch: r.specOnBatch === true }));
}

/**
 * Sandboxes' labels as rows of sandbox_labels, each with its sandbox's created_at: what a list by
 * label reads, in list order. Multi-row statements, as the rest of a group's rows.
 */
export async function insertLabelRows(
  tx: Sql,
  sandboxes: readonly { id: string; labels: Record<string, string>; createdAt: string }[],
): Promise<void> {
  const rows: SqlValue[][] = [];
  for (const s of sandboxes) for (const [k, v] of Object.entries(s.labels)) rows.push([s.id, k, v, s.createdAt]);
  await chunked(rows, (c) =>
    tx.run(
      multiInsert('sandbox_labels', ['sandbox_id', 'key', 'value', 'created_at'], c.length),
      flatValues(c, (r) => r),
    ),
  );
}

/** A sandbox's spec; `onBatch`: its batch's row has it (NewSandboxRow.specOnBatch). */
interface SpecRow {
  id: string;
  spec: unknown;
  onBatch?: boolean;
}

/**
 * Specs as [id, JSON text] rows (none for a spec its batch's row has) and the [volume, sandbox id]
 * rows of the volumes they mount (for every one).
 */
function specRows(specs: readonly SpecRow[]): { texts: [string, string][]; mounts: [string, string][] } {
  const json = jsonOnce(); // a group's items may share one spec object: it is serialized once
  const texts = specs.filter((s) => s.onBatch !== true).map(({ id, spec }): [string, string] => [id, json(spec)]);
  const mounts = specs.flatMap(({ id, spec }) =>
    ((spec as { volumes?: { name: string }[] } | null | undefined)?.volumes ?? []).map((v): [string, string] => [v.name, id]),
  );
  return { texts, mounts };
}

/**
 * Create requests as the callers sent them (replacing any kept), and the volumes each mounts, so
 * that a volume in use is found without reading every spec (those rows go with the sandbox's).
 */
export async function saveSpecRows(tx: Sql, specs: readonly SpecRow[]): Promise<void> {
  const { texts, mounts } = specRows(specs);
  await chunked(texts, (c) =>
    tx.run(
      multiInsert('sandbox_specs', ['id', 'spec'], c.length, ' ON CONFLICT (id) DO UPDATE SET spec = excluded.spec'),
      flatValues(c, (r) => r),
    ),
  );
  await chunked(mounts, (c) =>
    tx.run(
      multiInsert('volume_mounts', ['volume', 'sandbox_id'], c.length, ' ON CONFLICT DO NOTHING'),
      flatValues(c, (r) => r),
    ),
  );
}

type Settle = { id: string; status: SandboxStatus; reason?: string | undefined };
type SettledElsewhere = Map<string, { status: SandboxStatus; reason: string | null } | null>;

/**
 * Settles creates: each row becomes its `status` (and `reason`) only while it is still
 * `creating`. Returns, for each id that was not (another replica took the create over, its edge
 * was lost, it was killed), its status and reason now, or null when the row is gone. Each row's
 * settle stands alone, so nothing needs the rows settled together: SQLite runs the chunks in one
 * transaction (one commit); PostgreSQL runs one statement for all of them, outside a transaction
 * (a BEGIN and a COMMIT are two more round trips, see writeNewSandboxes).
 */
export async function settleCreates(db: SqlDb, updates: readonly Settle[]): Promise<SettledElsewhere> {
  const others: SettledElsewhere = new Map();
  if (db.dialect === 'sqlite') {
    await db.transaction((tx) => chunked(updates, (c) => settleChunk(tx, c, others)));
    return others;
  }
  const changed = await db.all<{ id: string }>(SETTLE_UPDATE, [settleParam(updates)]);
  if (changed.length < updates.length) await readOthers(db, updates, changed, others);
  return others;
}

/** PostgreSQL: a group's settles in one UPDATE, its rows one JSON parameter (settleParam). */
const SETTLE_UPDATE = `UPDATE sandboxes SET status = u.st, reason = u.why FROM json_to_recordset(?::json) AS u(sid text, st text, why text)
      WHERE id = u.sid AND status = 'creating' RETURNING id`;

function settleParam(updates: readonly Settle[]): string {
  return JSON.stringify(updates.map((u) => ({ sid: u.id, st: u.status, why: u.reason ?? null })));
}

async function settleChunk(tx: Sql, c: readonly Settle[], others: SettledElsewhere): Promise<void> {
  // A derived table both engines read alike (SQLite names no VALUES columns); its column names
  // are none of the table's, so neither engine finds one ambiguous.
  const sql = statementText(`settle${c.length}`, () => {
    const rows = c.map((_, i) => (i === 0 ? 'SELECT ? AS sid, ? AS st, ? AS why' : 'SELECT ?, ?, ?')).join(' UNION ALL ');
    return `UPDATE sandboxes SET status = u.st, reason = u.why FROM (${rows}) AS u WHERE id = u.sid AND status = 'creating' RETURNING id`;
  });
  const changed = await tx.all<{ id: string }>(
    sql,
    flatValues(c, (u) => [u.id, u.status, u.reason ?? null]),
  );
  if (changed.length < c.length) await readOthers(tx, c, changed, others);
}

/** What the rows a settle did not change say now (null: gone), into `others`. */
async function readOthers(on: Sql, wanted: readonly Settle[], changed: readonly { id: string }[], others: SettledElsewhere): Promise<void> {
  const done = new Set(changed.map((r) => r.id));
  const rest = wanted.filter((u) => !done.has(u.id)).map((u) => u.id);
  await chunked(rest, async (ids) => {
    const now = await on.all<{ id: string; status: SandboxStatus; reason: string | null }>(
      `SELECT id, status, reason FROM sandboxes WHERE id IN (${ids.map(() => '?').join(', ')})`,
      ids,
    );
    const byId = new Map(now.map((r) => [r.id, r]));
    for (const id of ids) {
      const r = byId.get(id);
      others.set(id, r ? { status: r.status, reason: r.reason } : null);
    }
  });
}
