import { ApiError } from '../../api-error.js';
import type { EdgeApi } from '../../edge/protocol/edge-api.js';
import type { EdgeCreateOutcome, EdgeCreateRequest, EdgeSandbox } from '../../edge/protocol/schemas.js';
import { TurnBatcher, type BatchHooks } from '../turn-batcher.js';

/**
 * Single creates bound for one remote edge, sent together: the creates that reach their edge call
 * in the same turn of the event loop, or while GROUPS_IN_FLIGHT requests are out to that edge, go
 * as one group request (EdgeApi.createSandboxes, the call a batch's group uses), so under load one
 * HTTP round trip, one request parse and one socket write carry many creates; a lone create still
 * goes at once (turn-batcher.ts). The edge answers a group a line per create as each settles
 * (NDJSON), and each create is answered then: a quick one does not wait for its group's slowest.
 * An in-process edge (`dsec up`) is called directly: there is no round trip to save.
 */
export class CreateCoalescer {
  readonly #batcher: TurnBatcher<EdgeCreateRequest, EdgeSandbox>;

  constructor(private readonly edges: { api(id: string): EdgeApi; isLocal(id: string): boolean }) {
    this.#batcher = new TurnBatcher((edgeId, reqs, hooks) => this.#send(edgeId, reqs, hooks), {
      maxBatch: GROUP_MAX,
      maxInflight: GROUPS_IN_FLIGHT,
    });
  }

  create(edgeId: string, req: EdgeCreateRequest): Promise<EdgeSandbox> {
    if (this.edges.isLocal(edgeId)) return this.edges.api(edgeId).createSandbox(req);
    return this.#batcher.add(edgeId, req);
  }

  async #send(edgeId: string, reqs: EdgeCreateRequest[], hooks: BatchHooks<EdgeSandbox>): Promise<(EdgeSandbox | Error)[]> {
    if (reqs.length === 1) {
      try {
        return [await this.edges.api(edgeId).createSandbox(reqs[0]!)];
      } catch (err) {
        return [err instanceof Error ? err : new Error(String(err))];
      }
    }
    const answer = (r: EdgeCreateRequest, o: EdgeCreateOutcome | undefined): EdgeSandbox | Error => {
      if (o?.sandbox) return o.sandbox;
      if (o?.error) return new ApiError(o.error.code as ApiError['code'], o.error.message, o.error.details);
      return new ApiError('SANDBOX_CREATE_FAILED', `edge ${edgeId} gave no answer for ${r.id}`);
    };
    try {
      // Each create is answered as its edge settles it, not when the group's slowest is done, and
      // the next group goes once the edge has this one (the edge, not this queue, paces its creates).
      const outcomes = await this.edges.api(edgeId).createSandboxes(reqs, {
        accepted: hooks.release,
        outcome: (i, o) => hooks.settle(i, answer(reqs[i]!, o)),
      });
      return reqs.map((r, i) => answer(r, outcomes[i]));
    } catch (err) {
      // Each create gets an error of its own: its caller adds its sandbox id to the details.
      if (err instanceof ApiError) return reqs.map(() => new ApiError(err.code, err.message, { ...err.details }));
      return reqs.map(() => (err instanceof Error ? err : new Error(String(err))));
    }
  }
}

/** Creates in one group request at most (the batch path's groups are as large; the edge runs 8 at a time). */
const GROUP_MAX = 256;
/**
 * Group requests out to one edge at once; creates that come meanwhile wait for one to answer and
 * go together. A loopback HTTP request costs the control plane ~100 µs of CPU however small (the
 * socket write is most of it), so under load the creates must share requests; an idle edge still
 * gets each create at once.
 */
const GROUPS_IN_FLIGHT = 2;
