import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { RegistryError, type RegistryClient } from '../../../image/registry/registry-client.js';

export interface RegistryChunkProxyOptions {
  registry: RegistryClient;
  /** The control plane's blob endpoint: chunk indexes, prefetch lists, and blobs the registry lacks. */
  fallbackUrl: string;
  fallbackToken: string;
  /** The bearer token dsec-chunk-fuse presents (a secret of this node, not the cluster token). */
  token: string;
  host?: string;
}

/**
 * What dsec-chunk-fuse reads chunks through when the edge has a registry (`dsec edge --registry
 * … --layer-fetch lazy`): the blob protocol the daemon speaks (`GET /v1/blobs/{digest}` with one
 * byte range, bearer token), answered from the registry with a Range request (the client does the
 * registry's auth and retries), or from the control plane's endpoint when the registry lacks the
 * blob or cannot be reached. Chunk indexes and prefetch lists are the control plane's: forwarded.
 */
export class RegistryChunkProxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  #url = '';
  /** Range requests answered from the registry, and requests sent on to the control plane. */
  readonly counts = { registryRanges: 0, fallback: 0 };

  constructor(private readonly opts: RegistryChunkProxyOptions) {
    this.#server = createServer((req, res) => void this.#handle(req, res));
    this.#server.on('connection', (s) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
  }

  get url(): string {
    return this.#url;
  }

  async listen(): Promise<string> {
    const host = this.opts.host ?? '127.0.0.1';
    await new Promise<void>((res) => this.#server.listen(0, host, res));
    const addr = this.#server.address();
    this.#url = `http://${host}:${typeof addr === 'object' && addr ? addr.port : 0}`;
    return this.#url;
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((res) => this.#server.close(() => res()));
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      if (req.headers.authorization !== `Bearer ${this.opts.token}`) return void res.writeHead(401).end();
      const m = /^\/v1\/blobs\/(sha256:[0-9a-f]{64})$/.exec(req.url ?? '');
      if (m && req.method === 'GET') {
        const range = /^bytes=(\d+)-(\d*)$/.exec(String(req.headers.range ?? ''));
        try {
          const blob = await this.opts.registry.getBlob(
            m[1]!,
            range ? { start: Number(range[1]), ...(range[2] ? { end: Number(range[2]) } : {}) } : undefined,
          );
          this.counts.registryRanges += range ? 1 : 0;
          res.writeHead(blob.status, {
            'content-type': 'application/octet-stream',
            ...(blob.size >= 0 ? { 'content-length': blob.size } : {}),
            ...(blob.contentRange ? { 'content-range': blob.contentRange } : {}),
          });
          await pipeline(blob.body, res);
          return;
        } catch (err) {
          if (!(err instanceof RegistryError)) throw err;
          // Not in the registry (an image built in this cluster), or the registry is down: the control plane has it.
        }
      }
      await this.#forward(req, res);
    } catch (err) {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end((err as Error).message);
      else res.destroy();
    }
  }

  async #forward(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.counts.fallback++;
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    const up = await fetch(`${this.opts.fallbackUrl}${req.url ?? ''}`, {
      method: req.method ?? 'GET',
      headers: {
        authorization: `Bearer ${this.opts.fallbackToken}`,
        ...(req.headers.range ? { range: String(req.headers.range) } : {}),
        ...(req.headers['content-type'] ? { 'content-type': String(req.headers['content-type']) } : {}),
      },
      ...(hasBody ? { body: Readable.toWeb(req) as unknown as RequestInit['body'], duplex: 'half' } : {}),
    } as RequestInit);
    const headers: Record<string, string> = {};
    for (const h of ['content-type', 'content-length', 'content-range']) {
      const v = up.headers.get(h);
      if (v !== null) headers[h] = v;
    }
    res.writeHead(up.status, headers);
    if (up.body) await pipeline(Readable.fromWeb(up.body as WebReadableStream), res);
    else res.end();
  }
}
