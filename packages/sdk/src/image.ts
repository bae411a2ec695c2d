import {
  BuildImageRequest,
  type GcResult,
  type ImageInfo,
  type ImageList,
  PullImageRequest,
  type PullImageResult,
  PushImageRequest,
  type PushImageResult,
} from './schema/index.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { checkBody, checkPath } from './validate.js';

type Opts = ConnectionOptions & CallOptions;

/**
 * An image: layers plus the config processes start with. Sandboxes start from one
 * (`Sandbox.create({ image: img.id })`); a snapshot makes one. An unnamed snapshot that was not
 * kept goes away with its sandbox and the sandboxes started from it (`info.snapshotOf` names it).
 */
export class Image {
  readonly #conn: Connection;

  private constructor(
    conn: Connection,
    /** sha256:… of the image's manifest. */
    readonly id: string,
    /** What the server last said about it (undefined for a snapshot's image until refresh()). */
    public info: ImageInfo | undefined,
  ) {
    this.#conn = conn;
  }

  /** @internal The image a snapshot made, on the sandbox's connection. */
  static fromSnapshot(conn: Connection, imageId: string): Image {
    return new Image(conn, imageId, undefined);
  }

  /** Every image on the server, oldest first. */
  static async list(opts: Opts = {}): Promise<Image[]> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    const res = await conn.json<ImageList>('GET', '/v1/images', { signal, timeoutMs });
    return res.images.map((i) => new Image(conn, i.id, i));
  }

  /** One image by name (`busybox`, `py:3.11`) or id; NotFoundError (IMAGE_NOT_FOUND) when there is none. */
  static async get(ref: string, opts: Opts = {}): Promise<Image> {
    checkPath(ref, 'ref');
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    const info = await conn.json<ImageInfo>('GET', `/v1/images/${encodeURIComponent(ref)}`, { signal, timeoutMs });
    return new Image(conn, info.id, info);
  }

  /**
   * Builds an image on the server: busybox (seconds) or a Debian minbase with packages (about a
   * minute), cached by its inputs.
   * @param opts.timeoutMs @default 900000 (15 min)
   * @example const py = await Image.build({ builder: 'debian', packages: ['python3'], name: 'py' });
   */
  static async build(opts: BuildImageRequest & Opts): Promise<Image> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, ...body } = opts;
    checkBody(BuildImageRequest, body, 'Image.build');
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    const info = await conn.json<ImageInfo>('POST', '/v1/images', { json: body, signal, timeoutMs: timeoutMs ?? 900_000 });
    return new Image(conn, info.id, info);
  }

  /**
   * Pushes an image to an OCI registry (`HOST[:PORT]/REPOSITORY[:TAG]`) with the control plane's
   * registry account; AuthError (REGISTRY_AUTH_FAILED) when the registry refuses it.
   * @param opts.timeoutMs @default 900000 (15 min)
   * @example const { digest } = await Image.push('busybox', 'registry.example:5000/team/busybox:v1');
   */
  static async push(image: string, ref: string, opts: Opts = {}): Promise<PushImageResult> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const body = { image, ref };
    checkBody(PushImageRequest, body, 'Image.push');
    return new Connection(connOpts).json<PushImageResult>('POST', '/v1/images/push', {
      json: body,
      signal,
      timeoutMs: timeoutMs ?? 900_000,
    });
  }

  /**
   * Pulls a dsec image from an OCI registry (by tag, or `REPOSITORY@sha256:…`) into the server's
   * image store; the result has the image, named `opts.name` or the repository's last part and tag.
   * @param opts.timeoutMs @default 900000 (15 min)
   */
  static async pull(ref: string, opts: Opts & { name?: string } = {}): Promise<PullImageResult & { handle: Image }> {
    const { signal, timeoutMs, name, ...connOpts } = opts;
    const body = { ref, ...(name !== undefined ? { name } : {}) };
    checkBody(PullImageRequest, body, 'Image.pull');
    const conn = new Connection(connOpts);
    const r = await conn.json<PullImageResult>('POST', '/v1/images/pull', { json: body, signal, timeoutMs: timeoutMs ?? 900_000 });
    return { ...r, handle: new Image(conn, r.image.id, r.image) };
  }

  /** Untags a name, or deletes an image by id with its names; layers are freed by gc(). */
  static async delete(ref: string, opts: Opts = {}): Promise<void> {
    checkPath(ref, 'ref');
    const { signal, timeoutMs, ...connOpts } = opts;
    await new Connection(connOpts).json<void>('DELETE', `/v1/images/${encodeURIComponent(ref)}`, { signal, timeoutMs });
  }

  /** Deletes layer blobs nothing uses; the result says what it kept and why. */
  static async gc(opts: Opts = {}): Promise<GcResult> {
    const { signal, timeoutMs, ...connOpts } = opts;
    return new Connection(connOpts).json<GcResult>('POST', '/v1/images/gc', { signal, timeoutMs: timeoutMs ?? 600_000 });
  }

  /** Names, layers, size and lifetime, fetched anew. */
  async refresh(opts: CallOptions = {}): Promise<ImageInfo> {
    this.info = await this.#conn.json<ImageInfo>('GET', `/v1/images/${encodeURIComponent(this.id)}`, opts);
    return this.info;
  }

  /** Deletes this image and its names (sandboxes running from it keep running). */
  async delete(opts: CallOptions = {}): Promise<void> {
    await this.#conn.json<void>('DELETE', `/v1/images/${encodeURIComponent(this.id)}`, opts);
  }
}
