import type { BulkProgress, BulkResult, SandboxStatus } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { Caller } from './callers.js';
import type { SandboxService } from './sandboxes.js';

/**
 * Kills, pauses or resumes every sandbox whose labels match, a few at a time: a kill unmounts,
 * removes cgroups and directories, and a thousand of them at once would only queue on the host.
 */
export const BULK_CONCURRENCY = 16;

export type BulkAction = 'kill' | 'pause' | 'resume';

/** Which sandboxes an action applies to: pause only running ones, resume only paused ones. */
const APPLIES_TO: Record<BulkAction, SandboxStatus | undefined> = { kill: undefined, pause: 'running', resume: 'paused' };

/** Over the caller's project's sandboxes (an admin key's: every project's, or the one it names in `project`). */
export async function applyByLabels(
  sandboxes: SandboxService,
  caller: Caller,
  labels: Record<string, string>,
  action: BulkAction,
  project?: string,
  onProgress?: (done: number, failed: number, total: number) => void,
): Promise<BulkResult> {
  const status = APPLIES_TO[action];
  const targets = await selectedIds(sandboxes, caller, { labels, ...(status ? { status } : {}), ...(project ? { project } : {}) });
  const result: BulkResult = { ids: [], failures: [] };
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < targets.length) {
      const id = targets[next++]!;
      try {
        if (action === 'kill') await sandboxes.kill(caller, id);
        else if (action === 'pause') await sandboxes.pause(caller, id);
        else await sandboxes.resume(caller, id);
        result.ids.push(id);
      } catch (err) {
        result.failures.push({ id, code: err instanceof ApiError ? err.code : 'INTERNAL', message: (err as Error).message });
      }
      onProgress?.(result.ids.length + result.failures.length, result.failures.length, targets.length);
    }
  };
  await Promise.all(Array.from({ length: Math.min(BULK_CONCURRENCY, targets.length) }, worker));
  result.ids.sort();
  return result;
}

/** Rows a bulk call's selection reads at a time. */
export const BULK_SELECT_PAGE = 1000;

/**
 * The ids a bulk call applies to, read a page at a time: each page is one short statement, and
 * other requests run between two (32,000 rows read in one statement held the control plane's
 * one thread for about 300 ms under bench cluster's hold of 200,000).
 */
async function selectedIds(
  sandboxes: SandboxService,
  caller: Caller,
  filter: { labels: Record<string, string>; status?: SandboxStatus; project?: string },
): Promise<string[]> {
  const ids: string[] = [];
  let after: string | undefined;
  do {
    const page = await sandboxes.page(caller, { ...filter, limit: BULK_SELECT_PAGE, ...(after ? { after } : {}) });
    for (const s of page.sandboxes) ids.push(s.id);
    after = page.next;
    if (after) await new Promise((r) => setImmediate(r));
  } while (after);
  return ids;
}

/** Between two progress reports of a bulk call streamed as NDJSON. */
export const BULK_PROGRESS_MS = 500;

/**
 * applyByLabels as a stream of progress reports: one at once (what the labels selected), then one
 * about every BULK_PROGRESS_MS while it runs, and last `done` with the result. A kill of 32,000
 * takes a minute and more; the caller sees it move instead of a silent request.
 */
export async function* applyByLabelsWithProgress(
  sandboxes: SandboxService,
  caller: Caller,
  labels: Record<string, string>,
  action: BulkAction,
  project?: string,
): AsyncGenerator<BulkProgress> {
  let state = { done: 0, failed: 0, total: -1 };
  let wake: (() => void) | undefined;
  const work = applyByLabels(sandboxes, caller, labels, action, project, (done, failed, total) => {
    const first = state.total < 0;
    state = { done, failed, total };
    if (first) wake?.();
  });
  let result: BulkResult | undefined;
  let error: unknown;
  const finished = work.then(
    (r) => void (result = r),
    (err: unknown) => void (error = err),
  );
  while (result === undefined && error === undefined) {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([finished, new Promise<void>((r) => ((wake = r), (timer = setTimeout(r, BULK_PROGRESS_MS))))]);
    clearTimeout(timer);
    if (result === undefined && error === undefined && state.total >= 0) yield { type: 'progress', ...state };
  }
  if (error !== undefined) throw error;
  const r = result!;
  const total = r.ids.length + r.failures.length;
  yield { type: 'done', total, done: total, failed: r.failures.length, ids: r.ids, failures: r.failures };
}
