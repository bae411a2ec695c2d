import { claimUidRange, handOverUidRange, holdsUidRange, releaseUidRange, uidRangesOf } from './host-claims.js';

/**
 * Host uid/gid ranges for sandboxes that run in a user namespace (edge option `userns`): the
 * sandbox's ids 0..SIZE-1 are host ids BASE..BASE+SIZE-1, so its root is an unprivileged host
 * user of its own. Ranges are 65,536 ids (every 16-bit id an image may use: nobody is 65534)
 * from 2^30 upward, far above any id a distribution hands out (Debian's /etc/subuid starts at
 * 100,000 and grows by 65,536 per user), and 2^14 of them fit below 2^31 (ids above that are
 * awkward for tools that treat them as signed).
 */
export interface UidRange {
  /** Host uid and gid of the sandbox's root. */
  base: number;
  size: number;
  /** The host-wide claim's slot (host/host-claims.ts). */
  slot: number;
}

export const UID_RANGE_SIZE = 65536;
export const FIRST_UID_BASE = 2 ** 30;
export const UID_RANGE_SLOTS = 2 ** 14;

export function rangeOfSlot(slot: number): UidRange {
  return { base: FIRST_UID_BASE + slot * UID_RANGE_SIZE, size: UID_RANGE_SIZE, slot };
}

/** The in-sandbox id of host id `id` under `range`; ids outside it read as the overflow id (nobody). */
export function toSandboxId(range: Pick<UidRange, 'base' | 'size'>, id: number): number {
  return id >= range.base && id < range.base + range.size ? id - range.base : OVERFLOW_ID;
}

/** What the kernel shows inside a user namespace for a host id it does not map (overflowuid). */
export const OVERFLOW_ID = 65534;

/** How ranges are claimed host-wide (host/host-claims.ts; replaceable in unit tests). */
export interface RangeClaims {
  claim(slot: number, edgeId: string, sandboxId: string): boolean;
  release(slot: number, edgeId: string, sandboxId: string): void;
  /** Moves a claim from one holder to another of the same edge without a moment unclaimed; false when `fromId` does not hold it. */
  handOver(slot: number, edgeId: string, fromId: string, toId: string): boolean;
  /** Whether `sandboxId` of `edgeId` holds slot `slot` (one claim read, not the host's all). */
  holds(slot: number, edgeId: string, sandboxId: string): boolean;
  /** This edge's claims on the host, with the sandbox each is for. */
  held(edgeId: string): { slot: number; sandboxId: string }[];
}

export const hostRangeClaims: RangeClaims = {
  claim: claimUidRange,
  release: releaseUidRange,
  handOver: handOverUidRange,
  holds: holdsUidRange,
  held: uidRangesOf,
};

/**
 * One edge's uid ranges. No two sandboxes on a host share a range, whichever edge made them, so
 * each range is claimed host-wide for one sandbox (the claim names edge and sandbox) and given
 * back when the sandbox is gone; the lowest free slot is taken, so ranges are reused. A holder
 * may also be a namespace the edge made ahead (edge/userns-pool.ts), handed over to a sandbox.
 */
export class UidRangePool {
  /** Slot → sandbox, for this edge's live sandboxes. */
  readonly #held = new Map<number, string>();

  constructor(
    private readonly edgeId: string,
    private readonly claims: RangeClaims = hostRangeClaims,
  ) {}

  take(sandboxId: string): UidRange {
    for (let slot = 0; slot < UID_RANGE_SLOTS; slot++) {
      if (this.#held.has(slot) || !this.claims.claim(slot, this.edgeId, sandboxId)) continue;
      this.#held.set(slot, sandboxId);
      return rangeOfSlot(slot);
    }
    throw new Error(`no free host uid range: all ${UID_RANGE_SLOTS} are claimed by sandboxes on this host`);
  }

  /**
   * Gives range `slot`, held for `fromId` (a namespace made ahead in edge/userns-pool.ts), to
   * sandbox `toId`: the host-wide claim changes hands without being released in between.
   */
  handOver(slot: number, fromId: string, toId: string): boolean {
    if (this.#held.get(slot) !== fromId || !this.claims.handOver(slot, this.edgeId, fromId, toId)) return false;
    this.#held.set(slot, toId);
    return true;
  }

  /** Records the range of a sandbox adopted after a restart; false when its claim is another's now. */
  adopt(sandboxId: string, range: UidRange): boolean {
    this.#held.set(range.slot, sandboxId);
    // One claim read per adopted sandbox: reading the host's all for each made a restart beside
    // 5,000 sandboxes quadratic (58.7 ms per adopt with 5,000 claims, ~5 minutes in all).
    return this.claims.holds(range.slot, this.edgeId, sandboxId) || this.claims.claim(range.slot, this.edgeId, sandboxId);
  }

  /** Gives back the range of `sandboxId`, if it has one. */
  release(sandboxId: string): void {
    for (const [slot, sb] of this.#held) {
      if (sb !== sandboxId) continue;
      this.#held.delete(slot);
      this.claims.release(slot, this.edgeId, sandboxId);
    }
  }

  /**
   * After a restart's clean-up: gives back every claim of this edge whose sandbox is not live (a
   * range claimed before a crash whose sandbox never started, or was cleaned up at start).
   */
  reconcile(live: (sandboxId: string) => boolean): number {
    let n = 0;
    for (const c of this.claims.held(this.edgeId)) {
      if (live(c.sandboxId) && this.#held.get(c.slot) === c.sandboxId) continue;
      this.claims.release(c.slot, this.edgeId, c.sandboxId);
      n++;
    }
    return n;
  }

  /** Slots this edge holds (tests, inspection). */
  slots(): number[] {
    return [...this.#held.keys()].sort((a, b) => a - b);
  }
}
