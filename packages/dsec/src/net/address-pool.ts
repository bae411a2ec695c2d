/**
 * Link-local /30 subnets for sandbox veth pairs: 169.254.X.Y/30 with X in 1–254 except 169
 * (169.254.169.254 is the cloud metadata address), so no sandbox link ever overlaps it. About
 * 16,000 subnets: the host side is .Y+1 (the sandbox's gateway), the sandbox side .Y+2.
 */
export interface Link {
  /** Host side address (the sandbox's default gateway). */
  host: string;
  /** Sandbox side address. */
  sandbox: string;
  index: number;
}

export function linkFor(index: number): Link {
  let third = Math.floor(index / PER_BLOCK) + 1;
  if (third >= 169) third++;
  if (third > 254) throw new Error('sandbox link address pool exhausted');
  const base = (index % PER_BLOCK) * 4;
  return { host: `169.254.${third}.${base + 1}`, sandbox: `169.254.${third}.${base + 2}`, index };
}

/** Links per block: one third octet of 169.254.0.0/16 holds 64 /30s. */
const PER_BLOCK = 64;
/** Third octets 1–254 less 169. */
const BLOCKS = 253;

/** How an edge claims blocks host-wide (host/host-claims.ts; replaceable in unit tests). */
export interface BlockClaims {
  claim(block: number, edgeId: string): boolean;
  release(block: number, edgeId: string): void;
}

/**
 * One edge's sandbox links. Edges that share a host must never hand out the same subnet (routes
 * would send one edge's traffic into the other's veth), so an edge takes addresses only from
 * blocks (third octets) it has claimed host-wide, claiming the next free block when its own are
 * full and giving a block back when its last link goes.
 */
export class AddressPool {
  readonly #used = new Set<number>();
  readonly #blocks = new Set<number>();

  constructor(
    private readonly edgeId: string,
    private readonly claims: BlockClaims,
  ) {}

  take(): Link {
    for (const b of [...this.#blocks].sort((x, y) => x - y)) {
      for (let i = b * PER_BLOCK; i < (b + 1) * PER_BLOCK; i++) if (!this.#used.has(i)) return this.#use(i);
    }
    for (let b = 0; b < BLOCKS; b++) {
      if (this.#blocks.has(b) || !this.claims.claim(b, this.edgeId)) continue;
      this.#blocks.add(b);
      return this.#use(b * PER_BLOCK);
    }
    throw new Error('sandbox link address pool exhausted: every link-local block on this host is taken');
  }

  #use(index: number): Link {
    this.#used.add(index);
    return linkFor(index);
  }

  /** Records a link an adopted sandbox already has; false when another edge now claims its block. */
  claim(index: number): boolean {
    this.#used.add(index);
    const b = Math.floor(index / PER_BLOCK);
    if (this.#blocks.has(b)) return true;
    this.#blocks.add(b);
    return this.claims.claim(b, this.edgeId);
  }

  release(index: number): void {
    this.#used.delete(index);
    const b = Math.floor(index / PER_BLOCK);
    for (let i = b * PER_BLOCK; i < (b + 1) * PER_BLOCK; i++) if (this.#used.has(i)) return;
    if (this.#blocks.delete(b)) this.claims.release(b, this.edgeId);
  }
}
