/**
 * How many events of a kind happened in the last minute, counted in one-second buckets (60
 * numbers, whatever the rate). Prometheus computes rates from counters over its own scrapes;
 * this is for a reader that looks once (`dsec top --once` right after a batch): two samples a
 * moment apart show the rate of that moment, 0 once the batch is over, while the last minute
 * still shows what it did.
 */
export const RECENT_WINDOW_S = 60;

export class RecentEvents {
  readonly #counts = new Array<number>(RECENT_WINDOW_S).fill(0);
  /** The second (epoch) each bucket counts; a bucket of an older second is stale and starts over. */
  readonly #seconds = new Array<number>(RECENT_WINDOW_S).fill(-1);

  add(n = 1, nowMs = Date.now()): void {
    const sec = Math.floor(nowMs / 1000);
    const i = sec % RECENT_WINDOW_S;
    if (this.#seconds[i] !== sec) {
      this.#seconds[i] = sec;
      this.#counts[i] = 0;
    }
    this.#counts[i]! += n;
  }

  /** Events in the last RECENT_WINDOW_S seconds, this one included. */
  total(nowMs = Date.now()): number {
    const sec = Math.floor(nowMs / 1000);
    let n = 0;
    for (let i = 0; i < RECENT_WINDOW_S; i++)
      if (this.#seconds[i]! > sec - RECENT_WINDOW_S && this.#seconds[i]! <= sec) n += this.#counts[i]!;
    return n;
  }
}
