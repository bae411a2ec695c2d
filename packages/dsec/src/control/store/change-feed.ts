import type { Socket } from 'node:net';
import pg from 'pg';
import type { Sql } from './sql.js';
import { sqliteStatements, type SqliteDb } from './sqlite-db.js';

/**
 * Tells a control plane when any replica changed a kind of record that it keeps in memory
 * (read-cache.ts), so the copy goes at once rather than after a timeout. On PostgreSQL: LISTEN on
 * one channel, with writers' NOTIFY sent in the transaction of their change (PostgreSQL delivers
 * it at the commit, and not at all on a rollback). On SQLite: asked rather than told
 * (SqliteChangeFeed), before each read from memory.
 */
export interface ChangeFeed {
  /** Whether changes are being heard now. While not, nothing may be served from memory. */
  readonly live: boolean;
  /** `listener` hears each changed topic, and `*` when the feed was lost or came back (anything may have changed). */
  subscribe(listener: (topic: string) => void): void;
  /**
   * For a feed that is asked rather than told: tells its listeners now of any change made since
   * it was last asked. A read from memory asks first, so it never serves what an earlier commit
   * changed.
   */
  catchUp?(): void;
  close(): Promise<void>;
}

/**
 * The requests a process has taken in, numbered as they arrive (http/request-log.ts keeps them):
 * a check made after a request arrived is fresh enough for everything that request reads.
 */
export interface RequestArrivals {
  /** How many requests have arrived so far. */
  count(): number;
  /**
   * The number of the request the running code serves while that request is being served;
   * undefined for work of no request, and for work a request started that outlives its response
   * (a batch's driver, a pool's refill), which looks again as background work does.
   */
  current(): number | undefined;
}

/**
 * SQLite's feed. This process's own changes empty the caches as they are written (the records'
 * writes do that on either engine); another connection's commit (the CLI's tools on a live
 * server's store, a test's second store) moves the database's data_version, which catchUp looks
 * at before each read from memory: any change by another connection empties every cache (`*`).
 * The reads it saves are a create's three (its API key, its project, its image's owners): each a
 * statement through the async wrapper, and a check of data_version costs about as much (it
 * begins a read transaction, with its file locks: two fcntl calls), so reads share a check
 * while they can (catchUp).
 */
export class SqliteChangeFeed implements ChangeFeed {
  #live = true;
  #version: number;
  /** Whether data_version was looked at in this callback of the event loop already (reset at its next tick). */
  #asked = false;
  /** Statements other connections of this process had run at the last check. */
  #othersAt = -1;
  /** Requests that had arrived at the last check. */
  #arrivedAt = 0;
  readonly #askAgain = (): void => {
    this.#asked = false;
  };
  readonly #listeners: ((topic: string) => void)[] = [];

  constructor(
    private readonly db: Pick<SqliteDb, 'dataVersion' | 'statements'>,
    private readonly arrivals?: RequestArrivals,
  ) {
    this.#version = db.dataVersion();
  }

  get live(): boolean {
    return this.#live;
  }

  subscribe(listener: (topic: string) => void): void {
    this.#listeners.push(listener);
  }

  catchUp(): void {
    // A check stands while no other connection of this process ran a statement since (one commits
    // only by a statement; this connection's own never move data_version) and either:
    // - the event loop is still in the callback that checked (its ticks): no new I/O is read
    //   meanwhile, so no request sent after another process's commit is served;
    // - or the code runs for a request that had arrived when the check was made: a commit made
    //   before that request was sent was made before the check, which saw it. A create's reads
    //   (its key in the onRequest hook, its project and image owners after its body) share one
    //   check this way, where the callback rule made them two; `dsec bench cluster` with
    //   --perf-basic-prof had the checks at ~4 % of the control plane's thread.
    const others = sqliteStatements() - this.db.statements;
    if (others === this.#othersAt) {
      if (this.#asked) return;
      const request = this.arrivals?.current();
      if (request !== undefined && request <= this.#arrivedAt) return;
    }
    // Read first: a look that throws (SQLITE_BUSY, an I/O error) must not count as made.
    const arrived = this.arrivals?.count() ?? 0;
    const version = this.db.dataVersion();
    if (!this.#asked) process.nextTick(this.#askAgain);
    this.#asked = true;
    this.#othersAt = others;
    this.#arrivedAt = arrived;
    if (version === this.#version) return;
    this.#version = version;
    for (const l of this.#listeners) l('*');
  }

  async close(): Promise<void> {
    this.#live = false;
  }
}

const CHANNEL = 'dsec_changes';

/** Announces a change of `topic` from inside the writer's transaction (PostgreSQL; a no-op on SQLite, where catchUp finds other connections' changes). */
export async function announceChange(tx: Sql, topic: string): Promise<void> {
  if (tx.dialect === 'postgres') await tx.run('SELECT pg_notify(?, ?)', [CHANNEL, topic]);
}

/** How long to wait before listening again after the connection broke. */
const RECONNECT_MS = 1000;

/** The feed over a connection of its own that LISTENs; reconnects while not closed. */
export class PostgresChangeFeed implements ChangeFeed {
  #client: pg.Client | undefined;
  #live = false;
  #closed = false;
  readonly #listeners: ((topic: string) => void)[] = [];

  private constructor(private readonly url: string) {}

  static async start(url: string): Promise<PostgresChangeFeed> {
    const feed = new PostgresChangeFeed(url);
    await feed.#connect().catch(() => feed.#retry());
    return feed;
  }

  get live(): boolean {
    return this.#live;
  }

  subscribe(listener: (topic: string) => void): void {
    this.#listeners.push(listener);
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#live = false;
    const client = this.#client;
    if (!client) return;
    // Held again while it closes: an unreferenced socket alone would let the process's loop end
    // with this close still waiting.
    (client.connection.stream as Partial<Socket>).ref?.();
    await client.end().catch(() => undefined);
  }

  async #connect(): Promise<void> {
    const client = new pg.Client({ connectionString: this.url });
    this.#client = client;
    const lost = (): void => {
      if (this.#client !== client) return;
      this.#client = undefined;
      this.#setLive(false);
      void client.end().catch(() => undefined);
      this.#retry();
    };
    client.on('error', lost);
    client.on('end', lost);
    client.on('notification', (n) => {
      if (n.channel === CHANNEL && n.payload) this.#emit(n.payload);
    });
    await client.connect();
    // Listening never keeps the process alive by itself (a server's sockets and timers do): a
    // store a tool or test opens and never closes must not hold its process open for ever.
    (client.connection.stream as Partial<Socket>).unref?.();
    await client.query(`LISTEN ${CHANNEL}`);
    // What changed while nothing listened is unknown: everything kept goes as the feed comes back.
    this.#setLive(true);
  }

  #retry(): void {
    if (this.#closed) return;
    setTimeout(() => {
      if (!this.#closed) void this.#connect().catch(() => this.#retry());
    }, RECONNECT_MS).unref();
  }

  #setLive(live: boolean): void {
    this.#live = live;
    this.#emit('*');
  }

  #emit(topic: string): void {
    for (const l of this.#listeners) l(topic);
  }
}
