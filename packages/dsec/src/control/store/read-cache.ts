import type { MaybePromise } from '../../maybe-promise.js';
import type { ChangeFeed } from './change-feed.js';

/**
 * Reads of one kind of record kept in memory while a change feed is live, so a request's lookups
 * (its API key, its project's quota) are not a database round trip each: on PostgreSQL every
 * read is one, a socket write and a wake-up at both ends; on SQLite a statement each, where a
 * create's reads share one check of the feed (change-feed.ts, SqliteChangeFeed). A change announced by any replica
 * (change-feed.ts) empties the cache; so does a write of this process (at once, before its
 * notification comes back) and a lost feed, while which nothing is kept. `ttlMs` bounds what a
 * feed that failed silently could leave. A read that was in flight while the cache was emptied is
 * not kept: it may have read the rows from before the change.
 */
export class ReadCache<V> {
  readonly #entries = new Map<string, { value: V; at: number }>();
  /** Bumped whenever the entries are emptied: a read that started before is not kept. */
  #generation = 0;

  constructor(
    private readonly feed: ChangeFeed | undefined,
    readonly topic: string,
    private readonly opts: { ttlMs: number; maxEntries: number; keep?: (value: V) => boolean },
  ) {
    feed?.subscribe((t) => {
      if (t === topic || t === '*') this.invalidate();
    });
  }

  /** The value kept for `key`, at once; else `read`'s, kept when it may be. */
  get(key: string, read: () => Promise<V>): MaybePromise<V> {
    if (!this.feed?.live) return read();
    this.feed.catchUp?.();
    const hit = this.#entries.get(key);
    if (hit && Date.now() - hit.at < this.opts.ttlMs) return hit.value;
    return this.#read(key, read);
  }

  async #read(key: string, read: () => Promise<V>): Promise<V> {
    const generation = this.#generation;
    const value = await read();
    if (generation === this.#generation && this.feed?.live && (this.opts.keep?.(value) ?? true)) {
      if (this.#entries.size >= this.opts.maxEntries) this.#entries.clear();
      this.#entries.set(key, { value, at: Date.now() });
    }
    return value;
  }

  invalidate(): void {
    this.#generation++;
    this.#entries.clear();
  }
}
