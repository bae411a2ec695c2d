import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { DiffLimitError, stageUpperDiff, type DiffLimits, type DiffStats, type IdRange } from './pack-diff.js';

/**
 * pack_diff's copy (stageUpperDiff) on a worker thread. The copy is synchronous file work over
 * a tree the sandbox shaped; on the edge's event loop a 2 GiB file stalled /healthz for 4.7 s and
 * every other sandbox's calls with it. On a thread of its own it stalls nothing, and a copy that
 * outlives its time limit or whose caller gives up (the request went away, the sandbox is being
 * killed) is stopped by terminating the thread; the caller removes the staging dir.
 *
 * The threads stay for the next copy (up to KEPT_IDLE of them, unref'd so they keep no process
 * alive) rather than one being started per snapshot. A thread that loads koffi (the copy's xattr
 * and mknod calls, host/syscalls.ts) leaves koffi's per-thread call stack and heap (1 MiB and
 * 2 MiB mappings) and some of its own memory behind when it exits, ~50 KiB resident each time: a
 * soak's snapshot every 10th cycle grew dsec's RSS steadily by it (docs/RELIABILITY.md, "Soak").
 * Starting a thread also cost the copy an isolate's start while the sandbox was frozen.
 */
interface Job {
  upper: string;
  stage: string;
  scrub: string[];
  limits: DiffLimits;
  ids: IdRange | undefined;
}

type Reply = { ok: true; stats: DiffStats } | { ok: false; name: string; message: string; details?: Record<string, unknown> };

/** Idle copy threads kept for the next snapshots; more run at once when more copies do, and end after theirs. */
export const KEPT_IDLE = 2;

if (!isMainThread && (workerData as { dsecStageWorker?: true } | undefined)?.dsecStageWorker) {
  parentPort!.on('message', (job: Job) => {
    let reply: Reply;
    try {
      reply = { ok: true, stats: stageUpperDiff(job.upper, job.stage, job.scrub, job.limits, job.ids) };
    } catch (err) {
      const e = err as Error & { details?: Record<string, unknown> };
      reply = { ok: false, name: e.name, message: e.message, ...(e.details ? { details: e.details } : {}) };
    }
    parentPort!.postMessage(reply);
  });
}

export class DiffCancelledError extends Error {
  override readonly name = 'DiffCancelledError';
}

const idle: Worker[] = [];
/** Threads started so far (tests: a copy after another reuses the thread). */
let started = 0;

export function stageThreadsStarted(): number {
  return started;
}

/** Idle threads kept now (tests: a stopped copy's thread is not among them). */
export function stageThreadsIdle(): number {
  return idle.length;
}

function takeThread(): Worker {
  const kept = idle.pop();
  if (kept) {
    kept.ref();
    return kept;
  }
  started++;
  return new Worker(new URL(import.meta.url), { workerData: { dsecStageWorker: true } });
}

/** A thread whose copy ended normally goes back to the idle set (or ends, when enough are kept). */
function giveBack(worker: Worker): void {
  worker.removeAllListeners('message').removeAllListeners('messageerror').removeAllListeners('error').removeAllListeners('exit');
  if (idle.length >= KEPT_IDLE) {
    void worker.terminate();
    return;
  }
  // An idle thread that dies (it should not) is dropped, not handed to the next copy.
  const drop = (): void => {
    const i = idle.indexOf(worker);
    if (i >= 0) idle.splice(i, 1);
  };
  worker.once('exit', drop).once('error', drop);
  worker.unref();
  idle.push(worker);
}

export function stageUpperDiffOffThread(
  upper: string,
  stage: string,
  scrub: string[],
  limits: DiffLimits,
  opts: { timeoutMs: number; signal?: AbortSignal | undefined; ids?: IdRange | undefined },
): Promise<DiffStats> {
  return new Promise<DiffStats>((resolve, reject) => {
    if (opts.signal?.aborted) return reject(new DiffCancelledError('the snapshot was cancelled'));
    const worker = takeThread();
    const onAbort = (): void => stop(new DiffCancelledError('the snapshot was cancelled'));
    let settled = false;
    const settle = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      fn();
    };
    // A copy stopped midway cannot be resumed or trusted: its thread ends with it.
    const stop = (err: Error): void => settle(() => void worker.terminate().finally(() => reject(err)));
    const timer = setTimeout(
      () =>
        stop(new DiffLimitError(`the snapshot copy took longer than ${opts.timeoutMs} ms and was stopped`, { timeoutMs: opts.timeoutMs })),
      opts.timeoutMs,
    );
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    worker.once('message', (m: Reply) =>
      settle(() => {
        giveBack(worker);
        if (m.ok) resolve(m.stats);
        else if (m.name === 'DiffLimitError') reject(new DiffLimitError(m.message, m.details ?? {}));
        else reject(new Error(m.message));
      }),
    );
    worker.once('error', (err) => settle(() => reject(err)));
    // An answer that cannot be deserialised would otherwise hold the sandbox frozen until the time limit.
    worker.once('messageerror', (err) => stop(err));
    worker.once('exit', (code) => settle(() => reject(new Error(`the snapshot copy thread exited (${code}) without an answer`))));
    const job: Job = { upper, stage, scrub, limits, ids: opts.ids };
    worker.postMessage(job);
  });
}
