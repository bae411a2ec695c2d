import { isChunkIndex, type ChunkIndex } from '../../../image/chunk-index.js';
import type { LayerDigest } from '../../../image/layer-store.js';

/** How long an index request may take before the create that needs it fails. */
const REQUEST_TIMEOUT_MS = 15_000;

/**
 * The edge's side of the blob store's chunk routes (the control plane's `/v1/blobs`): a layer's
 * per-chunk digest list with its prefetch list, and recording a prefetch list. Chunks themselves
 * are fetched by dsec-chunk-fuse, not here.
 */
export class BlobClient {
  constructor(
    readonly url: string,
    private readonly token?: string,
  ) {}

  async chunkIndex(digest: LayerDigest): Promise<{ chunks: ChunkIndex; prefetch: number[] }> {
    const res = await this.#request('GET', `/v1/blobs/${digest}/chunks`);
    const body: unknown = await res.json();
    if (!isChunkIndex(body)) throw new Error(`the blob store's chunk index of ${digest} is malformed`);
    const prefetch = (body as { prefetch?: unknown }).prefetch;
    return {
      chunks: { chunkSize: body.chunkSize, size: body.size, digests: body.digests },
      prefetch: Array.isArray(prefetch) ? prefetch.filter((i): i is number => Number.isSafeInteger(i) && (i as number) >= 0) : [],
    };
  }

  async putPrefetch(digest: LayerDigest, chunks: number[]): Promise<void> {
    await this.#request('PUT', `/v1/blobs/${digest}/prefetch`, { chunks });
  }

  async #request(method: string, path: string, body?: unknown): Promise<Response> {
    let res: Response;
    try {
      res = await fetch(`${this.url}${path}`, {
        method,
        headers: {
          ...(this.token ? { authorization: `Bearer ${this.token}` } : {}),
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
    } catch (err) {
      throw new Error(`blob store ${this.url} unreachable (${method} ${path}): ${(err as Error).message}`);
    }
    if (!res.ok) {
      const text = await res.text().catch(() => '');
      throw new Error(`blob store ${this.url}: ${method} ${path} answered ${res.status}${text ? `: ${text.slice(0, 300)}` : ''}`);
    }
    return res;
  }
}
