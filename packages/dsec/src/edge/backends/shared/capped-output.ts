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
    return this.#chunks.length === 1 ? this.#chunks[0]! : Buffer.concat(this.#chunks);
  }

  /** Kept bytes from `offset` on (for polling a background process). */
  since(offset: number): Buffer {
    return this.bytes().subarray(Math.min(offset, this.#kept));
  }

  encode(encoding: 'utf8' | 'base64'): string {
    return this.bytes().toString(encoding);
  }
}

const EMPTY = Buffer.alloc(0);
