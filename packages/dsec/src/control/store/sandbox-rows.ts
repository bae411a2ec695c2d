import type { SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { chunked, multiInsert } from './multi-row.js';
import type { Sql, SqlValue } from './sql.js';

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

function sandboxValues(r: NewSandboxRow, lease: CreateLease | undefined): SqlValue[] {
  const s = r.info;
  return [
    s.id,
    s.edge,
    s.status,
    s.image,
    s.imageId,
    JSON.stringify(s.resources),
    JSON.stringify(s.labels),
    s.createdAt,
    s.reason ?? null,
    JSON.stringify(s.layers),
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
 * New sandbox rows with their labels (sandbox_labels, in list order by created_at) and specs
 * (saveSpecRows): a few multi-row statements per table instead of several per sandbox.
 * Run it inside a transaction.
 */
export async function insertSandboxRows(tx: Sql, rows: readonly NewSandboxRow[], lease?: CreateLease): Promise<void> {
  await chunked(rows, (c) =>
    tx.run(
      multiInsert('sandboxes', SANDBOX_COLUMNS, c.length),
      c.flatMap((r) => sandboxValues(r, lease)),
    ),
  );
  await insertLabelRows(
    tx,
    rows.map((r) => ({ id: r.info.id, labels: r.info.labels, createdAt: r.info.createdAt })),
  );
  await saveSpecRows(
    tx,
    rows.filter((r) => r.spec !== undefined).map((r) => ({ id: r.info.id, spec: r.spec })),
  );
}

/**
 * Sandboxes' labels as rows of sandbox_labels, each with its sandbox's created_at: what a list by
 * label reads, in list order. Multi-row statements, as the rest of a group's rows.
 */
export async function insertLabelRows(
  tx: Sql,
  sandboxes: readonly { id: string; labels: Record<string, string>; createdAt: string }[],
): Promise<void> {
  const rows = sandboxes.flatMap((s) => Object.entries(s.labels).map(([k, v]) => [s.id, k, v, s.createdAt] as SqlValue[]));
  await chunked(rows, (c) => tx.run(multiInsert('sandbox_labels', ['sandbox_id', 'key', 'value', 'created_at'], c.length), c.flat()));
}

/**
 * Create requests as the callers sent them (replacing any kept), and the volumes each mounts, so
 * that a volume in use is found without reading every spec (those rows go with the sandbox's).
 */
export async function saveSpecRows(tx: Sql, specs: readonly { id: string; spec: unknown }[]): Promise<void> {
  // A batch's items share one spec object: it is serialized once.
  const texts = new Map<unknown, string>();
  const rows = specs.map(({ id, spec }) => {
    let text = texts.get(spec);
    if (text === undefined) texts.set(spec, (text = JSON.stringify(spec)));
    return [id, text] as SqlValue[];
  });
  await chunked(rows, (c) =>
    tx.run(multiInsert('sandbox_specs', ['id', 'spec'], c.length, ' ON CONFLICT (id) DO UPDATE SET spec = excluded.spec'), c.flat()),
  );
  const mounts = specs.flatMap(({ id, spec }) =>
    ((spec as { volumes?: { name: string }[] } | null | undefined)?.volumes ?? []).map((v) => [v.name, id] as SqlValue[]),
  );
  await chunked(mounts, (c) =>
    tx.run(multiInsert('volume_mounts', ['volume', 'sandbox_id'], c.length, ' ON CONFLICT DO NOTHING'), c.flat()),
  );
}

/**
 * Settles creates: each row becomes its `status` (and `reason`) only while it is still
 * `creating`. Returns, for each id that was not (another replica took the create over, its edge
 * was lost, it was killed), its status and reason now, or null when the row is gone. A few
 * statements per chunk of rows whatever their number. Run it inside a transaction.
 */
export async function settleCreatingRows(
  tx: Sql,
  updates: readonly { id: string; status: SandboxStatus; reason?: string | undefined }[],
): Promise<Map<string, { status: SandboxStatus; reason: string | null } | null>> {
  const others = new Map<string, { status: SandboxStatus; reason: string | null } | null>();
  await chunked(updates, async (c) => {
    // A derived table both engines read alike (SQLite names no VALUES columns); its column names
    // are none of the table's, so neither engine finds one ambiguous.
    const rows = c.map((_, i) => (i === 0 ? 'SELECT ? AS sid, ? AS st, ? AS why' : 'SELECT ?, ?, ?')).join(' UNION ALL ');
    const changed = await tx.all<{ id: string }>(
      `UPDATE sandboxes SET status = u.st, reason = u.why FROM (${rows}) AS u WHERE id = u.sid AND status = 'creating' RETURNING id`,
      c.flatMap((u) => [u.id, u.status, u.reason ?? null]),
    );
    if (changed.length === c.length) return;
    const done = new Set(changed.map((r) => r.id));
    const rest = c.filter((u) => !done.has(u.id)).map((u) => u.id);
    const now = await tx.all<{ id: string; status: SandboxStatus; reason: string | null }>(
      `SELECT id, status, reason FROM sandboxes WHERE id IN (${rest.map(() => '?').join(', ')})`,
      rest,
    );
    const byId = new Map(now.map((r) => [r.id, r]));
    for (const id of rest) {
      const r = byId.get(id);
      others.set(id, r ? { status: r.status, reason: r.reason } : null);
    }
  });
  return others;
}
