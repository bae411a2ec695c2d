/**
 * Work that arrives within one turn of the event loop, done as one batch per key: items are
 * queued as they come and the batch goes in `setImmediate`, after every I/O callback of the turn
 * has run. Under load a turn carries many requests, so their creates share one edge request or
 * one store transaction; a lone item waits for nothing but the rest of its own turn (no timer, no
 * fixed window). `run` answers each item with a value or an Error, in order; if it throws, every
 * item of the batch gets that error.
 */
export class TurnBatcher<I, O> {
  readonly #queued = new Map<string, Queued<I, O>[]>();

  constructor(
    private readonly run: (key: string, items: I[]) => Promise<(O | Error)[]>,
    private readonly maxBatch = 512,
  ) {}

  add(key: string, item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      let queue = this.#queued.get(key);
      if (!queue) {
        this.#queued.set(key, (queue = []));
        setImmediate(() => this.#flush(key));
      }
      queue.push({ item, resolve, reject });
    });
  }

  #flush(key: string): void {
    const queue = this.#queued.get(key) ?? [];
    this.#queued.delete(key);
    for (let i = 0; i < queue.length; i += this.maxBatch) void this.#send(key, queue.slice(i, i + this.maxBatch));
  }

  async #send(key: string, batch: Queued<I, O>[]): Promise<void> {
    let out: (O | Error)[];
    try {
      out = await this.run(
        key,
        batch.map((q) => q.item),
      );
    } catch (err) {
      for (const q of batch) q.reject(err);
      return;
    }
    for (const [i, q] of batch.entries()) {
      const o = out[i];
      if (o instanceof Error) q.reject(o);
      else if (o === undefined) q.reject(new Error(`a batch of ${batch.length} answered only ${out.length} items`));
      else q.resolve(o);
    }
  }
}

interface Queued<I, O> {
  item: I;
  resolve: (v: O) => void;
  reject: (err: unknown) => void;
}
