/**
 * Work that arrives within one turn of the event loop, done as one batch per key: items are
 * queued as they come and the batch goes in `setImmediate`, after every I/O callback of the turn
 * has run. Under load a turn carries many requests, so their creates share one edge request or
 * one store transaction; a lone item waits for nothing but the rest of its own turn (no timer, no
 * fixed window). With `maxInflight`, at most that many batches of a key are out at once: what
 * arrives meanwhile waits for one to come back and then goes together (Nagle's rule: an idle key
 * sends at once, a busy one sends bigger batches). `run` answers each item with a value or an
 * Error, in order; if it throws, every item of the batch gets that error. `run` may answer an item
 * earlier through `settle` (its index in the batch): its caller then has it at once, and what
 * `run` returns or throws later for that item is not heard. `run` may also `release` its place
 * among the batches in flight before it ends (the other side has the batch and works on it), so
 * the next batch need not wait for this one's slowest item. With `turns`, a batch goes after that
 * many check phases of the event loop rather than one: what comes in the turns between joins it.
 * Still no timer: an idle loop goes round at once, so a lone item waits for a few empty turns
 * (microseconds); a busy one gathers a few turns' worth of work into each batch.
 */
export class TurnBatcher<I, O> {
  readonly #keys = new Map<string, KeyState<I, O>>();

  constructor(
    private readonly run: (key: string, items: I[], hooks: BatchHooks<O>) => Promise<(O | Error)[]>,
    private readonly opts: { maxBatch?: number; maxInflight?: number; turns?: number } = {},
  ) {}

  add(key: string, item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      let k = this.#keys.get(key);
      if (!k) this.#keys.set(key, (k = { queue: [], inflight: 0, scheduled: false }));
      k.queue.push({ item, resolve, reject });
      this.#schedule(key, k);
    });
  }

  #schedule(key: string, k: KeyState<I, O>): void {
    if (k.scheduled) return;
    k.scheduled = true;
    let left = this.opts.turns ?? 1;
    const next = (): void => {
      if (--left > 0) setImmediate(next);
      else this.#flush(key, k);
    };
    setImmediate(next);
  }

  #flush(key: string, k: KeyState<I, O>): void {
    k.scheduled = false;
    const maxBatch = this.opts.maxBatch ?? 512;
    const maxInflight = this.opts.maxInflight ?? Number.POSITIVE_INFINITY;
    while (k.queue.length > 0 && k.inflight < maxInflight) void this.#send(key, k, k.queue.splice(0, maxBatch));
    if (k.queue.length === 0 && k.inflight === 0) this.#keys.delete(key);
  }

  async #send(key: string, k: KeyState<I, O>, batch: Queued<I, O>[]): Promise<void> {
    k.inflight++;
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      k.inflight--;
      // What queued while this batch was out goes now (with whatever else this turn brings).
      if (k.queue.length > 0) this.#schedule(key, k);
      else if (k.inflight === 0 && !k.scheduled) this.#keys.delete(key);
    };
    let out: (O | Error)[] | undefined;
    let failure: unknown;
    const answered = new Array<boolean>(batch.length).fill(false);
    const settle = (i: number, answer: O | Error): void => {
      const q = batch[i];
      if (!q || answered[i]) return;
      answered[i] = true;
      if (answer instanceof Error) q.reject(answer);
      else q.resolve(answer);
    };
    try {
      out = await this.run(
        key,
        batch.map((q) => q.item),
        { settle, release },
      );
    } catch (err) {
      failure = err;
    } finally {
      release();
    }
    for (const [i, q] of batch.entries()) {
      if (answered[i]) continue;
      const o = out?.[i];
      if (out === undefined) q.reject(failure);
      else if (o instanceof Error) q.reject(o);
      else if (o === undefined) q.reject(new Error(`a batch of ${batch.length} answered only ${out.length} items`));
      else q.resolve(o);
    }
  }
}

/** What a batch's `run` may do before it ends: answer an item, give up its place in flight. */
export interface BatchHooks<O> {
  settle(index: number, answer: O | Error): void;
  release(): void;
}

interface KeyState<I, O> {
  queue: Queued<I, O>[];
  inflight: number;
  scheduled: boolean;
}

interface Queued<I, O> {
  item: I;
  resolve: (v: O) => void;
  reject: (err: unknown) => void;
}
