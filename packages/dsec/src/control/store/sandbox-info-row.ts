import type { SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';

/**
 * A row of `sandboxes` as the API's SandboxInfo: as an object (fromRow), or straight as its JSON
 * text (sandboxListJson), the same fields in the order Fastify's serializer writes them.
 */

/**
 * The columns fromRow reads, named: `SELECT *` also brings the create lease, the access token and
 * the move's owner, and at 1,000 rows a page that cost a third of the list's time in SQLite.
 */
export const ROW_NAMES = [
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
  'backend',
  'project',
  'move_to',
  'move_since',
] as const satisfies readonly (keyof SandboxRow)[];
export const ROW_COLUMNS = ROW_NAMES.join(', ');
export const ROW_COLUMNS_S = ROW_NAMES.map((c) => `s.${c}`).join(', ');

export interface SandboxRow {
  id: string;
  edge: string;
  status: SandboxStatus;
  image: string;
  image_id: string;
  /** JSON texts, written by JSON.stringify of the SandboxInfo's own field (sandbox-rows.ts, sandbox-moves.ts, pools.ts). */
  resources: string;
  labels: string;
  created_at: string;
  reason: string | null;
  layers: string;
  ttl_seconds: number | null;
  idle_timeout_seconds: number | null;
  on_expiry: 'stop' | 'pause';
  expires_at: number | null;
  last_activity: number;
  backend: SandboxInfo['backend'];
  project: string;
  move_to?: string | null;
  move_since?: number | string | null;
}

/** A row read with `values` (its columns in ROW_NAMES' order) as the SandboxRow fromRow reads. */
export function rowOfValues(v: unknown[]): SandboxRow {
  const r: Record<string, unknown> = {};
  for (let i = 0; i < ROW_NAMES.length; i++) r[ROW_NAMES[i]!] = v[i];
  return r as unknown as SandboxRow;
}

export function fromRow(r: SandboxRow): SandboxInfo {
  const info: SandboxInfo = {
    id: r.id,
    edge: r.edge,
    project: r.project,
    backend: r.backend,
    status: r.status,
    image: r.image,
    imageId: r.image_id,
    resources: JSON.parse(r.resources) as SandboxInfo['resources'],
    labels: JSON.parse(r.labels) as Record<string, string>,
    layers: JSON.parse(r.layers) as string[],
    createdAt: r.created_at,
    onExpiry: r.on_expiry,
    lastActivityAt: lastActivityAt(r),
  };
  if (r.reason !== null) info.reason = r.reason;
  if (r.ttl_seconds !== null) info.ttlSeconds = r.ttl_seconds;
  if (r.idle_timeout_seconds !== null) info.idleTimeoutSeconds = r.idle_timeout_seconds;
  if (r.expires_at !== null) info.expiresAt = isoOf(r.expires_at);
  if (r.move_to) info.migration = { to: r.move_to, since: isoOf(Number(r.move_since)) };
  return info;
}

function lastActivityAt(r: SandboxRow): string {
  return r.last_activity ? isoOf(r.last_activity) : new Date(Date.parse(r.created_at)).toISOString();
}

/** The year 10000: from there toISOString writes six-digit years. */
const YEAR_10000 = 253_402_300_800_000;
let second = NaN;
let secondPrefix = '';

/**
 * new Date(ms).toISOString(), with the text up to the second kept from the last call: a page's
 * rows were mostly made in the same few seconds, and formatting a date for each of 1,000 rows was
 * a tenth of writing the page.
 */
function isoOf(ms: number): string {
  if (!(ms >= 0 && ms < YEAR_10000 && Number.isInteger(ms))) return new Date(ms).toISOString();
  const s = Math.floor(ms / 1000);
  if (s !== second) {
    secondPrefix = new Date(s * 1000).toISOString().slice(0, 20);
    second = s;
  }
  const milli = ms - s * 1000;
  return `${secondPrefix}${milli < 10 ? '00' : milli < 100 ? '0' : ''}${milli}Z`;
}

const q = JSON.stringify;

/**
 * The JSON text of fromRow(r) as Fastify's serializer (fast-json-stringify, from SandboxInfo)
 * writes it: the required fields in the schema's order, then the optional ones present. The three
 * JSON columns go in as they are stored: each is JSON.stringify of the very field, so parsing it
 * here only to write it again was work for the same text.
 */
function rowJson(r: SandboxRow): string {
  let s =
    `{"id":${q(r.id)},"edge":${q(r.edge)},"backend":${q(r.backend)},"status":${q(r.status)},"image":${q(r.image)}` +
    `,"imageId":${q(r.image_id)},"resources":${r.resources},"labels":${r.labels},"layers":${r.layers}` +
    `,"createdAt":${q(r.created_at)},"onExpiry":${q(r.on_expiry)},"lastActivityAt":"${lastActivityAt(r)}","project":${q(r.project)}`;
  if (r.reason !== null) s += `,"reason":${q(r.reason)}`;
  if (r.ttl_seconds !== null) s += `,"ttlSeconds":${r.ttl_seconds}`;
  if (r.idle_timeout_seconds !== null) s += `,"idleTimeoutSeconds":${r.idle_timeout_seconds}`;
  if (r.expires_at !== null) s += `,"expiresAt":"${isoOf(r.expires_at)}"`;
  if (r.move_to) s += `,"migration":{"to":${q(r.move_to)},"since":"${isoOf(Number(r.move_since))}"}`;
  return `${s}}`;
}

/**
 * A SandboxList (`{sandboxes, next?}`) as JSON text, written from the rows. Built as objects and
 * then serialized (3 JSON.parse, 13 fields and 2 dates a row, then fast-json-stringify walking
 * them), a page of 1,000 of a 400,000-row SQLite store took 12.3 ms with its read (p50), 9.1
 * written this way, and left every parsed object to collect (issue 31's pages of 32,000).
 */
export function sandboxListJson(rows: readonly SandboxRow[], next?: string): string {
  let s = '{"sandboxes":[';
  for (let i = 0; i < rows.length; i++) s += (i ? ',' : '') + rowJson(rows[i]!);
  return `${s}]${next === undefined ? '' : `,"next":${q(next)}`}}`;
}
