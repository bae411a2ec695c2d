/** POST /v1/batches and its NDJSON events, for the cluster scenario's batch and hold phases. */
import { round } from '../stats.js';
import type { BatchPhase, PerEdge } from './cluster-result.js';
import { ndjsonLines } from '../ndjson-lines.js';

export const MAX_ERRORS = 5;

export interface BatchEvent {
  seq: number;
  type: 'accepted' | 'placed' | 'running' | 'failed' | 'done' | 'cancelled';
  index?: number;
  code?: string;
  sandboxId?: string;
  edge?: string;
  reason?: string;
}

/** POST /v1/batches, then its events (NDJSON, resumed after the last seq on a reconnect) until `done`. */
export async function runBatchApi(
  url: string,
  apiKey: string,
  req: { count: number; spec: unknown; concurrency?: number },
  signal: AbortSignal,
  /** Collects the id of each sandbox that runs. */
  ids?: string[],
): Promise<(Omit<BatchPhase, 'readLatency' | 'createLatency' | 'spreadPct' | 'note' | 'mode'> & { id: string }) | undefined> {
  const { count } = req;
  const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/batches`, {
    method: 'POST',
    headers,
    body: JSON.stringify(req),
    signal,
  });
  if (res.status === 404) {
    const body = (await res.json().catch(() => ({}))) as { error?: { code?: string } };
    if (body.error?.code === 'ROUTE_NOT_FOUND') return undefined;
    throw new Error(`POST /v1/batches: HTTP 404 ${JSON.stringify(body)}`);
  }
  if (res.status !== 202) throw new Error(`POST /v1/batches: HTTP ${res.status} ${await res.text()}`);
  const acceptedSeconds = (performance.now() - t0) / 1000;
  const { id } = (await res.json()) as { id: string };
  const perEdge: PerEdge = {};
  const errors: string[] = [];
  const placed = new Set<number>();
  const running = new Set<number>();
  const failed = new Set<number>();
  let lastSeq = -1;
  let placedAt = NaN;
  let runningAt = NaN;
  let done = false;
  while (!done) {
    signal.throwIfAborted();
    const ev = await fetch(`${url}/v1/batches/${id}/events?after=${lastSeq}`, {
      headers: { authorization: headers.authorization },
      signal,
    });
    if (!ev.ok || !ev.body) throw new Error(`GET /v1/batches/${id}/events: HTTP ${ev.status} ${await ev.text()}`);
    for await (const e of ndjsonLines<BatchEvent>(ev.body)) {
      if (e.seq <= lastSeq) continue;
      lastSeq = e.seq;
      if (e.type === 'placed' && e.index !== undefined) placed.add(e.index);
      else if (e.type === 'running' && e.index !== undefined && !running.has(e.index)) {
        running.add(e.index);
        placed.add(e.index);
        if (ids && e.sandboxId) ids.push(e.sandboxId);
        if (e.edge) perEdge[e.edge] = (perEdge[e.edge] ?? 0) + 1;
      } else if (e.type === 'failed' && e.index !== undefined) {
        failed.add(e.index);
        if (errors.length < MAX_ERRORS) errors.push(`#${e.index}: ${e.code ?? ''} ${e.reason ?? 'failed'}`);
      } else if (e.type === 'done' || e.type === 'cancelled') done = true;
      const now = performance.now();
      if (Number.isNaN(placedAt) && placed.size + failed.size >= count) placedAt = now;
      if (Number.isNaN(runningAt) && running.size + failed.size >= count) runningAt = now;
    }
  }
  const end = performance.now();
  const placedSeconds = ((Number.isNaN(placedAt) ? end : placedAt) - t0) / 1000;
  const runningSeconds = ((Number.isNaN(runningAt) ? end : runningAt) - t0) / 1000;
  return {
    id,
    count,
    placed: running.size,
    failed: failed.size,
    errors,
    acceptedSeconds: round(acceptedSeconds, 3),
    placedSeconds: round(placedSeconds, 3),
    runningSeconds: round(runningSeconds, 3),
    placedPerSecond: round(placed.size / placedSeconds, 1),
    perEdge,
  };
}
