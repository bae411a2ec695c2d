import { CreatePoolRequest, type PoolInfo, type PoolList } from './schema/index.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { checkBody, checkPath } from './validate.js';

type Opts = ConnectionOptions & CallOptions;

/**
 * A warm pool: ready sandboxes of one spec, refilled in the background. A create naming the pool
 * (`Sandbox.create({ pool: 'py', image: 'py' })`) or matching its spec claims a ready one (never
 * one another caller used) instead of waiting for a new one.
 * @example const pool = await Pool.create({ name: 'py', size: 16, image: 'py' }); …; await pool.delete();
 */
export class Pool {
  readonly #conn: Connection;

  private constructor(
    conn: Connection,
    /** What the server last said about it: spec, sizes, claims, misses, refill times. */
    public info: PoolInfo,
  ) {
    this.#conn = conn;
  }

  get name(): string {
    return this.info.name;
  }

  /**
   * Creates a pool; it fills in the background (`(await pool.refresh()).ready` counts what is there).
   * @example await Pool.create({ name: 'py', size: 16, image: 'py', resources: { memoryMiB: 256 } });
   */
  static async create(opts: CreatePoolRequest & Opts): Promise<Pool> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, ...body } = opts;
    checkBody(CreatePoolRequest, body, 'Pool.create');
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    return new Pool(conn, await conn.json<PoolInfo>('POST', '/v1/pools', { json: body, signal, timeoutMs }));
  }

  /** Every pool with its sizes, claims, misses and refill times. */
  static async list(opts: Opts = {}): Promise<Pool[]> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    return (await conn.json<PoolList>('GET', '/v1/pools', { signal, timeoutMs })).pools.map((p) => new Pool(conn, p));
  }

  /** One pool; NotFoundError (POOL_NOT_FOUND) when there is none. */
  static async get(name: string, opts: Opts = {}): Promise<Pool> {
    checkPath(name, 'name');
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    return new Pool(conn, await conn.json<PoolInfo>('GET', `/v1/pools/${encodeURIComponent(name)}`, { signal, timeoutMs }));
  }

  /** Deletes a pool by name and kills its unclaimed sandboxes; claimed ones stay their callers'. */
  static async delete(name: string, opts: Opts = {}): Promise<void> {
    checkPath(name, 'name');
    const { signal, timeoutMs, ...connOpts } = opts;
    await new Connection(connOpts).json<void>('DELETE', `/v1/pools/${encodeURIComponent(name)}`, { signal, timeoutMs });
  }

  /** Its sizes, claims, misses and refill times, fetched anew. */
  async refresh(opts: CallOptions = {}): Promise<PoolInfo> {
    this.info = await this.#conn.json<PoolInfo>('GET', `/v1/pools/${encodeURIComponent(this.name)}`, opts);
    return this.info;
  }

  /** Deletes this pool and kills its unclaimed sandboxes; claimed ones stay their callers'. */
  async delete(opts: CallOptions = {}): Promise<void> {
    await this.#conn.json<void>('DELETE', `/v1/pools/${encodeURIComponent(this.name)}`, opts);
  }
}
