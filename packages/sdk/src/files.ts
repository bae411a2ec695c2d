import type { DirListing, FileStat, WriteFileResult } from './schema/index.js';
import type { CallOptions, Connection } from './connection.js';

/** Files inside a sandbox; every path resolves inside its root. */
export class Files {
  constructor(
    private readonly conn: Connection,
    private readonly id: string,
  ) {}

  #path(suffix = ''): string {
    return `/v1/sandboxes/${this.id}/files${suffix}`;
  }

  async read(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    const res = await this.conn.request('GET', this.#path(), { query: { path }, ...opts });
    return new Uint8Array(await res.arrayBuffer());
  }

  async readText(path: string, opts: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** Creates or replaces a file (parents created). */
  async write(path: string, data: string | Uint8Array, opts: CallOptions & { mode?: number } = {}): Promise<WriteFileResult> {
    const body = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const { mode, ...call } = opts;
    return this.conn.json<WriteFileResult>('PUT', this.#path(), { body, query: { path, mode: mode === undefined ? undefined : mode.toString(8) }, ...call });
  }

  async stat(path: string, opts: CallOptions = {}): Promise<FileStat> {
    return this.conn.json<FileStat>('GET', this.#path('/stat'), { query: { path }, ...opts });
  }

  async exists(path: string, opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, opts);
      return true;
    } catch (err) {
      if ((err as { status?: number }).status === 404) return false;
      throw err;
    }
  }

  async list(path: string, opts: CallOptions = {}): Promise<DirListing> {
    return this.conn.json<DirListing>('GET', this.#path('/list'), { query: { path }, ...opts });
  }

  async mkdir(path: string, opts: CallOptions & { parents?: boolean } = {}): Promise<void> {
    const { parents, ...call } = opts;
    await this.conn.json<void>('POST', this.#path('/mkdir'), { json: { path, parents: parents ?? true }, ...call });
  }

  async remove(path: string, opts: CallOptions & { recursive?: boolean } = {}): Promise<void> {
    const { recursive, ...call } = opts;
    await this.conn.json<void>('DELETE', this.#path(), { query: { path, recursive: recursive ? 'true' : undefined }, ...call });
  }

  async rename(from: string, to: string, opts: CallOptions = {}): Promise<void> {
    await this.conn.json<void>('POST', this.#path('/rename'), { json: { from, to }, ...opts });
  }

  /** Unpacks a tar archive into `dir` (created if missing), inside the sandbox. */
  async uploadTar(dir: string, archive: Uint8Array, opts: CallOptions = {}): Promise<{ path: string; bytes: number }> {
    return this.conn.json('PUT', this.#path('/tar'), { body: archive, contentType: 'application/x-tar', query: { path: dir }, ...opts });
  }

  /** A file or directory as a tar archive (one top-level entry: its name). */
  async downloadTar(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    const res = await this.conn.request('GET', this.#path('/tar'), { query: { path }, ...opts });
    return new Uint8Array(await res.arrayBuffer());
  }
}
