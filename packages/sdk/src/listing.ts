import { InvalidRequestError, UnreachableError } from './errors.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { readNdjson } from './ndjson.js';
import {
  BulkRequest,
  type BulkProgress,
  type BulkResult,
  type SandboxCounts,
  type SandboxInfo,
  type ListOrder,
  type SandboxList,
  type SandboxStatus,
} from './schema/index.js';
import { checkBody } from './validate.js';

/** Which sandboxes a listing selects: all of `labels`, one status, one project (an admin key). */
export interface ListFilter {
  labels?: Record<string, string>;
  status?: SandboxStatus;
  project?: string;
}

export type ListOptions = ConnectionOptions & CallOptions & ListFilter;

/** The largest page the server gives (ListSandboxesQuery's limit). */
export const MAX_PAGE = 10_000;

function listQuery(
  f: ListFilter,
  page?: { limit: number; after?: string | undefined; order?: ListOrder | undefined },
): Record<string, string | string[] | undefined> {
  return {
    label: Object.entries(f.labels ?? {}).map(([k, v]) => `${k}=${v}`),
    status: f.status,
    project: f.project,
    limit: page ? String(page.limit) : undefined,
    after: page?.after,
    order: page?.order,
  };
}

/** Every sandbox the filter selects, in one answer. */
export async function listSandboxes(opts: ListOptions): Promise<SandboxInfo[]> {
  const { signal, timeoutMs, labels, status, project, ...connOpts } = opts;
  const res = await new Connection(connOpts).json<SandboxList>('GET', '/v1/sandboxes', {
    query: listQuery({ labels, status, project }),
    signal,
    timeoutMs,
  });
  return res.sandboxes;
}

/** One page (oldest first, or newest with `order: 'newest'`) and the cursor of the next, absent on the last. */
export async function listPage(opts: ListOptions & { limit: number; after?: string; order?: ListOrder }): Promise<SandboxList> {
  const { signal, timeoutMs, labels, status, project, limit, after, order, ...connOpts } = opts;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE)
    throw new InvalidRequestError(`limit must be an integer from 1 to ${MAX_PAGE}, got ${String(limit)}`, 'INVALID_REQUEST', undefined, {
      field: 'limit',
    });
  return new Connection(connOpts).json<SandboxList>('GET', '/v1/sandboxes', {
    query: listQuery({ labels, status, project }, { limit, after, order }),
    signal,
    timeoutMs,
  });
}

/**
 * Every sandbox the filter selects, a page at a time (`pageSize`, default 1,000): a trainer's
 * 32,000 sandboxes without one answer of all of them. Each page is its own call.
 */
export async function* iterateSandboxes(opts: ListOptions & { pageSize?: number }): AsyncGenerator<SandboxInfo> {
  const { pageSize = 1000, ...rest } = opts;
  let after: string | undefined;
  do {
    const page = await listPage({ ...rest, limit: pageSize, ...(after ? { after } : {}) });
    yield* page.sandboxes;
    after = page.next;
  } while (after);
}

/** Sandboxes by status, counted by the server (the caller's project's; an admin key: all, or `project`'s). */
export async function countSandboxes(opts: ConnectionOptions & CallOptions & { project?: string } = {}): Promise<SandboxCounts> {
  const { signal, timeoutMs, project, ...connOpts } = opts;
  return new Connection(connOpts).json<SandboxCounts>('GET', '/v1/sandboxes/counts', { query: { project }, signal, timeoutMs });
}

export type BulkAction = 'kill' | 'pause' | 'resume';

export type BulkOptions = ConnectionOptions &
  CallOptions &
  BulkRequest & {
    /** Hears the server's progress (about every 500 ms, then the last line); the call is then streamed as NDJSON. */
    onProgress?: (p: BulkProgress) => void;
  };

/** kill / pause / resume of every sandbox `labels` selects, with the server's progress when `onProgress` is given. */
export async function bulk(action: BulkAction, opts: BulkOptions): Promise<BulkResult> {
  const { signal, timeoutMs, labels, onProgress, ...connOpts } = opts;
  checkBody(BulkRequest, { labels }, `Sandbox.${action}All`);
  const conn = new Connection(connOpts);
  const call = { json: { labels }, signal, timeoutMs: timeoutMs ?? 600_000 };
  if (!onProgress) return conn.json<BulkResult>('POST', `/v1/sandboxes/${action}`, call);
  const res = await conn.request('POST', `/v1/sandboxes/${action}`, { ...call, accept: 'application/x-ndjson' });
  if (!res.body) throw new UnreachableError(`the ${action} stream has no body`, 'STREAM_BROKEN', res.status);
  for await (const p of readNdjson<BulkProgress>(res.body)) {
    onProgress(p);
    if (p.type === 'done') return { ids: p.ids ?? [], failures: p.failures ?? [] };
  }
  throw new UnreachableError(`the ${action} stream ended before its result`, 'STREAM_BROKEN', res.status);
}
