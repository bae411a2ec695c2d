import { ApiError } from '../../api-error.js';
import type { SandboxLimits } from '../protocol/edge-api.js';

/** What the node holds now, read from its backends when a create asks. */
export interface NodeHoldings {
  /** Sandboxes running here that the control plane placed (function-call workers not counted). */
  sandboxes: number;
  /** Sandbox slots on offer to the control plane (the node's maximum less its workers). */
  maxSandboxes: number;
  /** Sum of the cpu limits of the sandboxes running here. */
  cpuCommitted: number;
  /** The node's CPUs. */
  cpus: number;
}

/**
 * The node's word on sandbox slots and CPU, for every backend at once, so that no number of
 * control-plane replicas can place past what the node has. Each replica places from the capacity
 * the edge last reported plus what it placed itself since; two replicas do not see each other's
 * placements until the next heartbeat, so both may pick a nearly full node in the same second.
 * The node decides atomically instead: a create holds its slot and CPU here, synchronously, before
 * its first await, until its backend has settled it (then it is counted among the running), and a
 * create that does not fit is refused with CAPACITY_EXCEEDED, which a replica answers by placing it
 * on another edge (control/service/sandbox-creation.ts). Nothing goes through the store: the
 * replicas never contend with each other on a create, only a node's own creates meet here.
 *
 * `cpuOvercommit` is the edge's `--cpu-overcommit`: CPU limits may add up to that many times the
 * node's CPUs; 0 sets no cap (the default), as placement.ts reads it.
 */
export class NodeBudget {
  #heldSlots = 0;
  #heldCpu = 0;

  constructor(
    private readonly edgeId: string,
    private readonly cpuOvercommit: number,
    private readonly holdings: () => NodeHoldings,
  ) {}

  /** Holds a slot and `limits.cpu` for one create; the returned function gives them back (call it once). */
  hold(limits: Pick<SandboxLimits, 'cpu'>): () => void {
    const now = this.holdings();
    if (now.sandboxes + this.#heldSlots >= now.maxSandboxes) {
      throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.edgeId} is full (${now.maxSandboxes} sandboxes)`, {
        maxSandboxes: now.maxSandboxes,
      });
    }
    if (this.cpuOvercommit > 0) {
      const cap = now.cpus * this.cpuOvercommit;
      const committed = now.cpuCommitted + this.#heldCpu;
      // A little slack for the sums of fractional limits (0.1 + 0.2 > 0.3 in floating point).
      if (committed + limits.cpu > cap + 1e-9) {
        throw new ApiError(
          'CAPACITY_EXCEEDED',
          `edge ${this.edgeId} has ${round(committed)} of its ${round(cap)} CPUs committed (${now.cpus} CPUs × --cpu-overcommit ${this.cpuOvercommit}); a sandbox of ${limits.cpu} CPU does not fit`,
          { cpuCommitted: round(committed), cpuCap: round(cap), cpuOvercommit: this.cpuOvercommit },
        );
      }
    }
    this.#heldSlots++;
    this.#heldCpu += limits.cpu;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#heldSlots--;
      this.#heldCpu = Math.max(0, this.#heldCpu - limits.cpu);
    };
  }
}

const round = (n: number): number => Math.round(n * 1000) / 1000;
