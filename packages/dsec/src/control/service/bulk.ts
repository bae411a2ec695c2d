import type { BulkResult, SandboxStatus } from '@dsec/sdk/schema';
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
): Promise<BulkResult> {
  const status = APPLIES_TO[action];
  const targets = (await sandboxes.list(caller, { labels, ...(status ? { status } : {}), ...(project ? { project } : {}) })).map(
    (s) => s.id,
  );
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
    }
  };
  await Promise.all(Array.from({ length: Math.min(BULK_CONCURRENCY, targets.length) }, worker));
  result.ids.sort();
  return result;
}
