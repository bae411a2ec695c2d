/**
 * One output stream of a command: keeps the first `cap` bytes, counts every byte. Past the cap
 * nothing more is held in memory, so `yes` for minutes costs CPU, never memory.
 */
export class CappedOutput {
  readonly #chunks: Buffer[] = [];
  #kept = 0;
  total = 0;

  constructor(readonly cap: number) {}

  /** Records a chunk; returns the part that was kept (empty once past the cap). */
  push(chunk: Buffer): Buffer {
    this.total += chunk.length;
    if (this.#kept >= this.cap) return EMPTY;
    const take = chunk.length <= this.cap - this.#kept ? chunk : chunk.subarray(0, this.cap - this.#kept);
    this.#chunks.push(take);
    this.#kept += take.length;
    return take;
  }

  get truncated(): boolean {
    return this.total > this.#kept;
  }

  bytes(): Buffer {
    return this.since(0);
  }

  /**
   * Kept bytes from `offset` on (for polling a background process). Only the chunks from there on
   * are joined: a poll of a process that kept 64 MiB copies what is new, not all 64 MiB again.
   */
  since(offset: number): Buffer {
    let skip = Math.min(offset, this.#kept);
    let first = 0;
    while (first < this.#chunks.length && skip >= this.#chunks[first]!.length) skip -= this.#chunks[first++]!.length;
    if (first === this.#chunks.length) return EMPTY;
    const head = this.#chunks[first]!.subarray(skip);
    return first === this.#chunks.length - 1 ? head : Buffer.concat([head, ...this.#chunks.slice(first + 1)]);
  }

  encode(encoding: 'utf8' | 'base64'): string {
    return this.bytes().toString(encoding);
  }
}

const EMPTY = Buffer.alloc(0);
