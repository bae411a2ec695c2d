import { DsecError, UnreachableError } from './errors.js';
import type { CallOptions, Connection } from './connection.js';
import { readNdjson } from './ndjson.js';
import type { BatchEvent, BatchInfo } from './schema/index.js';

/** What a batch's progress adds up to so far. */
export interface BatchProgress {
  count: number;
  placed: number;
  running: number;
  failed: number;
}

/**
 * A batch's progress events, from `after` on, until the batch ends. A stream that breaks (a
 * restarted control plane, a dropped connection) is picked up again after the last event seen,
 * so no event is lost or repeated; it gives up after `retries` breaks in a row with no event.
 */
export async function* batchEvents(
  conn: Connection,
  id: string,
  opts: CallOptions & { after?: number; retries?: number } = {},
): AsyncGenerator<BatchEvent> {
  let after = opts.after ?? -1;
  let failures = 0;
  for (;;) {
    let ended = false;
    try {
      const res = await conn.request('GET', `/v1/batches/${encodeURIComponent(id)}/events`, {
        query: { after: String(after) },
        accept: 'application/x-ndjson',
        signal: opts.signal,
        timeoutMs: opts.timeoutMs ?? 24 * 3600_000,
      });
      if (!res.body) throw new UnreachableError('the batch stream has no body', 'STREAM_BROKEN', res.status);
      for await (const e of readNdjson<BatchEvent>(res.body)) {
        after = e.seq;
        failures = 0;
        yield e;
        if (e.type === 'done' || e.type === 'cancelled') ended = true;
      }
      if (ended) return;
    } catch (err) {
      if (opts.signal?.aborted || (err instanceof DsecError && err.status !== undefined && err.status >= 400 && err.status < 500))
        throw err;
      if (++failures > (opts.retries ?? 30)) throw err;
    }
    if (ended) return;
    await new Promise((r) => setTimeout(r, Math.min(200 * failures, 2000)));
  }
}

export async function batchInfo(conn: Connection, id: string, opts: CallOptions = {}): Promise<BatchInfo> {
  return conn.json<BatchInfo>('GET', `/v1/batches/${encodeURIComponent(id)}`, opts);
}
