import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { DiffLimitError, stageUpperDiff, type DiffLimits, type DiffStats, type IdRange } from './pack-diff.js';

/**
 * pack_diff's copy (stageUpperDiff) on a worker thread. The copy is synchronous file work over
 * a tree the sandbox shaped; on the edge's event loop a 2 GiB file stalled /healthz for 4.7 s and
 * every other sandbox's calls with it. On a thread of its own it stalls nothing, and a copy that
 * outlives its time limit or whose caller gives up (the request went away, the sandbox is being
 * killed) is stopped by terminating the thread; the caller removes the staging dir.
 */
interface Job {
  dsecStageJob: true;
  upper: string;
  stage: string;
  scrub: string[];
  limits: DiffLimits;
  ids: IdRange | undefined;
}

type Reply = { ok: true; stats: DiffStats } | { ok: false; name: string; message: string; details?: Record<string, unknown> };

if (!isMainThread && (workerData as Job | undefined)?.dsecStageJob) {
  const job = workerData as Job;
  let reply: Reply;
  try {
    reply = { ok: true, stats: stageUpperDiff(job.upper, job.stage, job.scrub, job.limits, job.ids) };
  } catch (err) {
    const e = err as Error & { details?: Record<string, unknown> };
    reply = { ok: false, name: e.name, message: e.message, ...(e.details ? { details: e.details } : {}) };
  }
  parentPort!.postMessage(reply);
}

export class DiffCancelledError extends Error {
  override readonly name = 'DiffCancelledError';
}

export function stageUpperDiffOffThread(
  upper: string,
  stage: string,
  scrub: string[],
  limits: DiffLimits,
  opts: { timeoutMs: number; signal?: AbortSignal | undefined; ids?: IdRange | undefined },
): Promise<DiffStats> {
  return new Promise<DiffStats>((resolve, reject) => {
    const job: Job = { dsecStageJob: true, upper, stage, scrub, limits, ids: opts.ids };
    const worker = new Worker(new URL(import.meta.url), { workerData: job });
    let settled = false;
    const settle = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      fn();
    };
    const stop = (err: Error): void => settle(() => void worker.terminate().finally(() => reject(err)));
    const timer = setTimeout(
      () => stop(new DiffLimitError(`the snapshot copy took longer than ${opts.timeoutMs} ms and was stopped`, { timeoutMs: opts.timeoutMs })),
      opts.timeoutMs,
    );
    const onAbort = (): void => stop(new DiffCancelledError('the snapshot was cancelled'));
    if (opts.signal?.aborted) return onAbort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    worker.once('message', (m: Reply) =>
      settle(() => {
        if (m.ok) resolve(m.stats);
        else if (m.name === 'DiffLimitError') reject(new DiffLimitError(m.message, m.details ?? {}));
        else reject(new Error(m.message));
      }),
    );
    worker.once('error', (err) => settle(() => reject(err)));
    worker.once('exit', (code) => settle(() => reject(new Error(`the snapshot copy thread exited (${code}) without an answer`))));
  });
}
