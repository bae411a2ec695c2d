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
  const perOctet = 64;
  let third = Math.floor(index / perOctet) + 1;
  if (third >= 169) third++;
  if (third > 254) throw new Error('sandbox link address pool exhausted');
  const base = (index % perOctet) * 4;
  return { host: `169.254.${third}.${base + 1}`, sandbox: `169.254.${third}.${base + 2}`, index };
}

export class AddressPool {
  readonly #used = new Set<number>();

  take(): Link {
    for (let i = 0; ; i++) {
      if (!this.#used.has(i)) {
        this.#used.add(i);
        return linkFor(i);
      }
    }
  }

  claim(index: number): void {
    this.#used.add(index);
  }

  release(index: number): void {
    this.#used.delete(index);
  }
}
