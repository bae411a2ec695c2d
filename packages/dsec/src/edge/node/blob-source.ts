import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { createReadStream, existsSync, rmSync } from 'node:fs';
import { Readable } from 'node:stream';
import { ApiError } from '../../api-error.js';
import { sha256File, type LayerDigest, type LayerStore } from '../../image/layer-store.js';
import type { BlobSource } from '../../image/blob-source.js';

export type { BlobSource } from '../../image/blob-source.js';

/** The layer store on this node's filesystem: `dsec up`, or a shared mount every node sees. */
export class LocalBlobSource implements BlobSource {
  constructor(readonly store: LayerStore) {}

  localPath(digest: LayerDigest): string | undefined {
    const p = this.store.path(digest);
    return existsSync(p) ? p : undefined;
  }

  async open(digest: LayerDigest): Promise<Readable> {
    // A store that caches a remote one (the cluster's registry) fetches what it lacks first.
    if (!(await this.store.fetch(digest)))
      throw new ApiError('IMAGE_NOT_FOUND', `layer ${digest} is not in the layer store`, { layer: digest });
    return createReadStream(this.store.path(digest));
  }

  has(digest: LayerDigest): boolean {
    return this.store.has(digest);
  }

  remove(digest: LayerDigest): Promise<number> {
    return Promise.resolve(this.store.remove(digest));
  }

  async put(file: string): Promise<LayerDigest> {
    try {
      return await this.store.add(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
      // The store is on another filesystem than the node's scratch space: copy while hashing.
      try {
        return await this.store.addStream(createReadStream(file));
      } finally {
        rmSync(file, { force: true });
      }
    }
  }
}

/** The control plane's blob endpoint (`/v1/blobs/{digest}`), with the cluster token. */
export class HttpBlobSource implements BlobSource {
  readonly #urls: string[];
  #current = 0;

  /** `baseUrl`: a control plane's URL, or several comma-separated (replicas): the next is tried when one does not answer. */
  constructor(
    baseUrl: string,
    readonly token: string,
  ) {
    this.#urls = baseUrl
      .split(',')
      .map((u) => u.trim().replace(/\/$/, ''))
      .filter(Boolean);
  }

  get baseUrl(): string {
    return this.#urls[this.#current]!;
  }

  /** fetch at the current replica, moving to the next (once round) when one cannot be reached. */
  async #fetch(path: string, init: RequestInit): Promise<Response> {
    for (let tried = 1; ; tried++) {
      try {
        return await fetch(`${this.baseUrl}${path}`, init);
      } catch (err) {
        if (tried >= this.#urls.length || init.body) throw err;
        this.#current = (this.#current + 1) % this.#urls.length;
      }
    }
  }

  localPath(): undefined {
    return undefined;
  }

  has(): undefined {
    return undefined;
  }

  async open(digest: LayerDigest): Promise<Readable> {
    let res: Response;
    try {
      res = await this.#fetch(`/v1/blobs/${digest}`, { headers: { authorization: `Bearer ${this.token}` } });
    } catch (err) {
      throw new ApiError('EDGE_UNAVAILABLE', `cannot reach the blob endpoint at ${this.baseUrl}: ${(err as Error).message}`, {
        layer: digest,
      });
    }
    if (res.status === 404) throw new ApiError('IMAGE_NOT_FOUND', `layer ${digest} is not in the cluster's blob store`, { layer: digest });
    if (!res.ok || !res.body)
      throw new ApiError('INTERNAL', `blob endpoint answered ${res.status} for ${digest}`, { layer: digest, status: res.status });
    return Readable.fromWeb(res.body as WebReadableStream);
  }

  async put(file: string): Promise<LayerDigest> {
    const digest = await sha256File(file);
    try {
      const res = await fetch(`${this.baseUrl}/v1/blobs/${digest}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/vnd.dsec.layer.erofs' },
        body: Readable.toWeb(createReadStream(file)) as unknown as RequestInit['body'],
        duplex: 'half',
      } as RequestInit);
      if (res.status !== 201)
        throw new ApiError('INTERNAL', `uploading layer ${digest} failed: HTTP ${res.status} ${await res.text()}`, { layer: digest });
      return digest;
    } finally {
      rmSync(file, { force: true });
    }
  }
}
