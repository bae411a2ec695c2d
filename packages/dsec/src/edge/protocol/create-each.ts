import { ApiError } from '../../api-error.js';
import type { GroupCreateListener } from './edge-api.js';
import type { EdgeCreateOutcome, EdgeCreateRequest, EdgeSandbox } from './schemas.js';

/**
 * createSandboxes for an in-process edge: the creates run `concurrency` at a time (a node's crun
 * and mounts gain nothing from more), and each item's error is kept as data; a `listener` hears
 * that the group started and each item as it settles.
 */
export async function createEach(
  create: (req: EdgeCreateRequest) => Promise<EdgeSandbox>,
  reqs: EdgeCreateRequest[],
  concurrency: number,
  listener?: GroupCreateListener,
): Promise<EdgeCreateOutcome[]> {
  const out: EdgeCreateOutcome[] = new Array<EdgeCreateOutcome>(reqs.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < reqs.length) {
      const i = next++;
      const req = reqs[i]!;
      try {
        out[i] = { id: req.id, sandbox: await create(req) };
      } catch (err) {
        const e = err instanceof ApiError ? err : new ApiError('SANDBOX_CREATE_FAILED', (err as Error).message);
        out[i] = { id: req.id, error: { code: e.code, message: e.message, details: e.details } };
      }
      listener?.outcome?.(i, out[i]!);
    }
  };
  const workers = Array.from({ length: Math.max(1, Math.min(concurrency, reqs.length)) }, worker);
  listener?.accepted?.();
  await Promise.all(workers);
  return out;
}
