import { CreateVolumeRequest, type VolumeInfo, type VolumeList } from './schema/index.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { checkBody, checkPath } from './validate.js';

type Opts = ConnectionOptions & CallOptions;

/**
 * A named volume: a persistent directory with a lifecycle of its own, kept on one node, mounted
 * into sandboxes at create (`Sandbox.create({ volumes: [{ name, path, readOnly }] })`), read-only
 * or read-write, and kept when they are killed. For datasets and package caches.
 * @example const v = await Volume.create('pip-cache'); await Sandbox.create({ volumes: [{ name: v.name, path: '/root/.cache/pip' }] });
 */
export class Volume {
  readonly #conn: Connection;

  private constructor(
    conn: Connection,
    /** What the server last said about it. */
    public info: VolumeInfo,
  ) {
    this.#conn = conn;
  }

  get name(): string {
    return this.info.name;
  }

  /** Creates a volume (VOLUME_EXISTS, a ConflictError, if the name is taken). `edge` pins it to a node. */
  static async create(name: string, opts: Omit<CreateVolumeRequest, 'name'> & Opts = {}): Promise<Volume> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, ...rest } = opts;
    const body: CreateVolumeRequest = { name, ...rest };
    checkBody(CreateVolumeRequest, body, 'Volume.create');
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    return new Volume(conn, await conn.json<VolumeInfo>('POST', '/v1/volumes', { json: body, signal, timeoutMs }));
  }

  static async list(opts: Opts = {}): Promise<Volume[]> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    return (await conn.json<VolumeList>('GET', '/v1/volumes', { signal, timeoutMs })).volumes.map((v) => new Volume(conn, v));
  }

  /** One volume with the size of its files (`info.bytes`); NotFoundError (VOLUME_NOT_FOUND) when there is none. */
  static async get(name: string, opts: Opts = {}): Promise<Volume> {
    checkPath(name, 'name');
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    return new Volume(conn, await conn.json<VolumeInfo>('GET', `/v1/volumes/${encodeURIComponent(name)}`, { signal, timeoutMs }));
  }

  /** Reads the volume's state again (who mounts it, its size). */
  async refresh(opts: CallOptions = {}): Promise<Volume> {
    this.info = await this.#conn.json<VolumeInfo>('GET', `/v1/volumes/${encodeURIComponent(this.name)}`, opts);
    return this;
  }

  /** Deletes it and its files; ConflictError (VOLUME_IN_USE) while a sandbox mounts it. */
  async delete(opts: CallOptions = {}): Promise<void> {
    await this.#conn.json('DELETE', `/v1/volumes/${encodeURIComponent(this.name)}`, opts);
  }
}
