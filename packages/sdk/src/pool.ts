import { CreatePoolRequest, type PoolInfo, type PoolList } from './schema/index.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { checkBody, checkPath } from './validate.js';

type Opts = ConnectionOptions & CallOptions;

/**
 * Warm pools: ready sandboxes of one spec, refilled in the background. A create naming the pool
 * (`Sandbox.create({ pool: 'py', image: 'py' })`) or matching its spec claims a ready one (never
 * one another caller used) instead of waiting for a new one.
 */
export const Pool = {
  /**
   * Creates a pool; it fills in the background (`ready` in `Pool.get` counts what is there).
   * @example await Pool.create({ name: 'py', size: 16, image: 'py', resources: { memoryMiB: 256 } });
   */
  async create(opts: CreatePoolRequest & Opts): Promise<PoolInfo> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, ...body } = opts;
    checkBody(CreatePoolRequest, body, 'Pool.create');
    return new Connection({ url, apiKey, requestTimeoutMs }).json<PoolInfo>('POST', '/v1/pools', { json: body, signal, timeoutMs });
  },

  /** Every pool with its sizes, claims, misses and refill times. */
  async list(opts: Opts = {}): Promise<PoolInfo[]> {
    const { signal, timeoutMs, ...conn } = opts;
    return (await new Connection(conn).json<PoolList>('GET', '/v1/pools', { signal, timeoutMs })).pools;
  },

  /** One pool; NotFoundError (POOL_NOT_FOUND) when there is none. */
  async get(name: string, opts: Opts = {}): Promise<PoolInfo> {
    checkPath(name, 'name');
    const { signal, timeoutMs, ...conn } = opts;
    return new Connection(conn).json<PoolInfo>('GET', `/v1/pools/${encodeURIComponent(name)}`, { signal, timeoutMs });
  },

  /** Deletes a pool and kills its unclaimed sandboxes; claimed ones stay their callers'. */
  async delete(name: string, opts: Opts = {}): Promise<void> {
    checkPath(name, 'name');
    const { signal, timeoutMs, ...conn } = opts;
    await new Connection(conn).json<void>('DELETE', `/v1/pools/${encodeURIComponent(name)}`, { signal, timeoutMs });
  },
};
