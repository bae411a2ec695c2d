import { createReadStream, statSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { isLayerDigest, type LayerDigest, type LayerStore } from '../../../image/layer-store.js';

export interface BlobServerOptions {
  store: LayerStore;
  /** Required bearer token; unset: no auth. */
  token?: string;
  /** Bytes per second across all responses (a shared token bucket); 0: unlimited. */
  rateBytesPerSec?: number;
  host?: string;
}

/**
 * A blob store endpoint of its own, speaking the control plane's blob protocol (`GET|HEAD
 * /v1/blobs/{digest}` with single byte ranges, `GET .../chunks`, `PUT .../prefetch`) over a layer
 * store, for the lazy tests and `dsec bench lazy`: it can be rate limited (a slow link), taken
 * down (connections reset), made to hang (accepts, never answers) or to corrupt bytes it sends,
 * which the real endpoint never does. Counts the bytes it served.
 */
export class BlobServer {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  #url = '';
  /** Connections are reset on arrival. */
  down = false;
  /** Requests are accepted and never answered. */
  hang = false;
  /** The next N blob range responses have one byte flipped. */
  corruptNext = 0;
  bytesServed = 0;
  rangeRequests = 0;
  #bucketAt = 0;

  constructor(private readonly opts: BlobServerOptions) {
    this.#server = createServer((req, res) => void this.#handle(req, res));
    this.#server.on('connection', (s) => {
      if (this.down) {
        s.destroy();
        return;
      }
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
  }

  get url(): string {
    return this.#url;
  }

  async listen(port = 0): Promise<string> {
    const host = this.opts.host ?? '127.0.0.1';
    await new Promise<void>((res) => this.#server.listen(port, host, res));
    const addr = this.#server.address();
    this.#url = `http://${host}:${typeof addr === 'object' && addr ? addr.port : port}`;
    return this.#url;
  }

  /** Resets every open connection (a store outage mid-transfer). */
  dropConnections(): void {
    for (const s of this.#sockets) s.destroy();
  }

  async close(): Promise<void> {
    this.dropConnections();
    await new Promise<void>((res) => this.#server.close(() => res()));
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (this.hang) return; // never answered; the socket goes at close()
    if (this.opts.token && req.headers.authorization !== `Bearer ${this.opts.token}`)
      return send(res, 401, { error: { code: 'UNAUTHORIZED', message: 'bad token' } });
    const m = /^\/v1\/blobs\/(sha256:[0-9a-f]{64})(\/chunks|\/prefetch)?$/.exec(req.url ?? '');
    const digest = m?.[1];
    if (!m || !digest || !isLayerDigest(digest) || !this.opts.store.has(digest))
      return send(res, 404, { error: { code: 'NOT_FOUND', message: 'no such blob' } });
    if (m[2] === '/chunks' && req.method === 'GET') {
      return send(res, 200, { ...(await this.opts.store.chunkIndex(digest)), prefetch: this.opts.store.prefetchList(digest) });
    }
    if (m[2] === '/prefetch' && req.method === 'PUT') {
      let body = '';
      for await (const c of req) body += String(c);
      const chunks = (JSON.parse(body) as { chunks?: unknown }).chunks;
      if (!Array.isArray(chunks) || !chunks.every((i) => Number.isSafeInteger(i) && i >= 0))
        return send(res, 400, { error: { code: 'INVALID_REQUEST', message: 'chunks: integers' } });
      this.opts.store.recordPrefetchList(digest, chunks as number[]);
      return send(res, 204);
    }
    if (m[2] || (req.method !== 'GET' && req.method !== 'HEAD'))
      return send(res, 405, { error: { code: 'INVALID_REQUEST', message: 'method' } });
    await this.#blob(req, res, digest);
  }

  async #blob(req: IncomingMessage, res: ServerResponse, digest: LayerDigest): Promise<void> {
    const file = this.opts.store.path(digest);
    const size = statSync(file).size;
    let start = 0;
    let end = size - 1;
    const range = req.headers.range;
    if (range) {
      const r = /^bytes=(\d+)-(\d*)$/.exec(range);
      if (!r || Number(r[1]) >= size) {
        res.writeHead(416, { 'content-range': `bytes */${size}` }).end();
        return;
      }
      start = Number(r[1]);
      end = r[2] ? Math.min(Number(r[2]), size - 1) : size - 1;
      this.rangeRequests++;
    }
    res.writeHead(range ? 206 : 200, {
      'content-length': end - start + 1,
      'accept-ranges': 'bytes',
      ...(range ? { 'content-range': `bytes ${start}-${end}/${size}` } : {}),
    });
    if (req.method === 'HEAD') return void res.end();
    let corrupt = range !== undefined && this.corruptNext > 0;
    if (corrupt) this.corruptNext--;
    for await (const chunk of createReadStream(file, { start, end, highWaterMark: 64 * 1024 })) {
      const buf = chunk as Buffer;
      if (corrupt) {
        buf[0] = buf[0]! ^ 0xff;
        corrupt = false;
      }
      await this.#throttle(buf.length);
      if (res.destroyed) return;
      this.bytesServed += buf.length;
      if (!res.write(buf)) await new Promise((r) => res.once('drain', r));
    }
    res.end();
  }

  /** A shared token bucket: each slice waits until the link would have carried it. */
  async #throttle(bytes: number): Promise<void> {
    const rate = this.opts.rateBytesPerSec ?? 0;
    if (rate <= 0) return;
    const now = performance.now();
    this.#bucketAt = Math.max(this.#bucketAt, now) + (bytes / rate) * 1000;
    const wait = this.#bucketAt - now;
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
  }
}

function send(res: ServerResponse, status: number, body?: unknown): void {
  if (body === undefined) return void res.writeHead(status).end();
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}
