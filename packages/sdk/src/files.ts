import type { DirListing, FileStat, WriteFileResult } from './schema/index.js';
import type { CallOptions, Connection } from './connection.js';
import { checkBytes, checkData, checkOptionalInt, checkPath } from './validate.js';

/** Files inside a sandbox; every path resolves inside its root. */
export class Files {
  constructor(
    private readonly conn: Connection,
    private readonly id: string,
  ) {}

  #path(suffix = ''): string {
    return `/v1/sandboxes/${this.id}/files${suffix}`;
  }

  /** A file's bytes (at most 64 MiB: larger files go through downloadTar). */
  async read(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    checkPath(path);
    const res = await this.conn.request('GET', this.#path(), { query: { path }, ...opts });
    return new Uint8Array(await res.arrayBuffer());
  }

  async readText(path: string, opts: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /**
   * Creates or replaces a file (parents created); a string is written as UTF-8. At most 64 MiB
   * per file (larger: uploadTar, up to 1 GiB).
   * @param opts.mode permission bits, e.g. 0o755. @default 0o644
   */
  async write(path: string, data: string | Uint8Array, opts: CallOptions & { mode?: number } = {}): Promise<WriteFileResult> {
    checkPath(path);
    checkData(data);
    checkOptionalInt(opts.mode, 'mode');
    const body = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const { mode, ...call } = opts;
    return this.conn.json<WriteFileResult>('PUT', this.#path(), {
      body,
      query: { path, mode: mode === undefined ? undefined : mode.toString(8) },
      ...call,
    });
  }

  async stat(path: string, opts: CallOptions = {}): Promise<FileStat> {
    checkPath(path);
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
    checkPath(path);
    return this.conn.json<DirListing>('GET', this.#path('/list'), { query: { path }, ...opts });
  }

  async mkdir(path: string, opts: CallOptions & { parents?: boolean } = {}): Promise<void> {
    checkPath(path);
    const { parents, ...call } = opts;
    await this.conn.json<void>('POST', this.#path('/mkdir'), { json: { path, parents: parents ?? true }, ...call });
  }

  async remove(path: string, opts: CallOptions & { recursive?: boolean } = {}): Promise<void> {
    checkPath(path);
    const { recursive, ...call } = opts;
    await this.conn.json<void>('DELETE', this.#path(), { query: { path, recursive: recursive ? 'true' : undefined }, ...call });
  }

  async rename(from: string, to: string, opts: CallOptions = {}): Promise<void> {
    checkPath(from, 'from');
    checkPath(to, 'to');
    await this.conn.json<void>('POST', this.#path('/rename'), { json: { from, to }, ...opts });
  }

  /** Unpacks a tar archive into `dir` (created if missing), inside the sandbox. */
  async uploadTar(dir: string, archive: Uint8Array, opts: CallOptions = {}): Promise<{ path: string; bytes: number }> {
    checkPath(dir, 'dir');
    checkBytes(archive, 'archive');
    return this.conn.json('PUT', this.#path('/tar'), { body: archive, contentType: 'application/x-tar', query: { path: dir }, ...opts });
  }

  /** A file or directory as a tar archive (one top-level entry: its name). */
  async downloadTar(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    checkPath(path);
    const res = await this.conn.request('GET', this.#path('/tar'), { query: { path }, ...opts });
    return new Uint8Array(await res.arrayBuffer());
  }
}
