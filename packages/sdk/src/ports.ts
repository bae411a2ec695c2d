import type { Duplex } from 'node:stream';
import WebSocket from 'ws';
import type { CallOptions, Connection } from './connection.js';
import { AbortedError, ERROR_CODES, InvalidRequestError, UnreachableError, errorFromWire } from './errors.js';
import { parsePortFrame, webSocketStream } from './port-stream.js';
import { DSEC_ERROR_HEADER, type PortLink, type PortWaitResult } from './schema/index.js';
import { checkOptionalInt } from './validate.js';

function checkPort(port: unknown, where: string): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new InvalidRequestError(
      `${where}: port must be an integer from 1 to 65535, got ${JSON.stringify(port)}`,
      'INVALID_REQUEST',
      undefined,
      {
        field: 'port',
      },
    );
  }
  return port;
}

function checkSubPath(path: unknown, where: string): string {
  if (typeof path !== 'string')
    throw new InvalidRequestError(`${where}: path must be a string, got ${typeof path}`, 'INVALID_REQUEST', undefined, { field: 'path' });
  // A '..' segment would be resolved by the URL parser and leave the port's prefix (reaching the
  // API itself with the key); control characters, spaces and '#' have no place in a request path.
  const segments = path.split('?')[0]!.split('/');
  if (segments.includes('..') || /[\u0000-\u0020\u007f#]/.test(path))
    throw new InvalidRequestError(
      `${where}: path ${JSON.stringify(path.slice(0, 100))} has a '..' segment, a control character, a space or '#': give the path on the server as it is (percent-encode what needs it)`,
      'INVALID_REQUEST',
      undefined,
      { field: 'path' },
    );
  return path.startsWith('/') ? path : `/${path}`;
}

/**
 * Ports of a server running in the sandbox, reached through the control plane's proxy: the
 * server listens on the sandbox's own loopback (127.0.0.1 or ::1, or 0.0.0.0), under any
 * network policy, `none` included. HTTP (streamed both ways) and WebSocket upgrades pass
 * through; `connect()` gives a raw TCP stream for any other protocol.
 */
export class Ports {
  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
  ) {}

  /**
   * The proxy URL of `path` on `port`. It needs the API key (`Authorization: Bearer`), as
   * `fetch()` here sends it; for a browser, use `link()`. The server sees the path below the
   * prefix (`/v1/sandboxes/{id}/ports/{port}`), which it also gets as X-Forwarded-Prefix.
   * @example sb.ports.url(8000, '/health') // 'http://127.0.0.1:7070/v1/sandboxes/sb-…/ports/8000/health'
   */
  url(port: number, path = '/'): string {
    return `${this.conn.url}/v1/sandboxes/${this.sandboxId}/ports/${checkPort(port, 'ports.url')}${checkSubPath(path, 'ports.url')}`;
  }

  /**
   * `fetch()` of `path` on `port` with the API key added. The answer is the server's own, whatever
   * its status; dsec's own errors are thrown instead: ServerError PORT_NOT_LISTENING when nothing
   * listens on the port yet (`wait()` for it first), PORT_BAD_RESPONSE when the server's answer
   * is not HTTP, and the sandbox's (not found, not running).
   * @example await sb.ports.wait(8000); const r = await sb.ports.fetch(8000, '/'); console.log(r.status, await r.text());
   */
  async fetch(port: number, path = '/', init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set('authorization', `Bearer ${this.conn.apiKey}`);
    const res = await fetch(this.url(port, path), { ...init, headers });
    // Only dsec's own error answers carry the header (the proxy drops it from a server's answers);
    // it counts only on an error status whose body names the same code, else the answer is the server's.
    const code = res.headers.get(DSEC_ERROR_HEADER);
    if (code === null || res.status < 400) return res;
    const body = await res.clone().text();
    let wire: { error?: { code?: string; message?: string; details?: Record<string, unknown> } } | undefined;
    try {
      wire = JSON.parse(body) as typeof wire;
    } catch {
      wire = undefined;
    }
    if (wire?.error?.code !== code) return res;
    throw errorFromWire(res.status, wire.error);
  }

  /**
   * Resolves once something in the sandbox accepts connections on `port` (nothing is sent to it,
   * so any protocol can be waited for): for a server started with `commands.start` before the
   * first `fetch`. TimeoutError (PORT_WAIT_TIMEOUT) after `timeoutMs` (default 30 s, at most 300 s).
   * @example await sb.commands.start('python3 -m http.server 8000'); await sb.ports.wait(8000);
   */
  async wait(port: number, opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<PortWaitResult> {
    checkPort(port, 'ports.wait');
    checkOptionalInt(opts.timeoutMs, 'ports.wait timeoutMs', 0);
    const waitMs = opts.timeoutMs ?? 30_000;
    return this.conn.json<PortWaitResult>('POST', `/v1/sandboxes/${this.sandboxId}/port-waits`, {
      json: { port, timeoutMs: waitMs },
      // The call lasts as long as the wait, and a little more for the answer.
      timeoutMs: waitMs + 10_000,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
  }

  /**
   * A signed URL that opens `port` without an API key, for a browser; it works until it expires
   * (default 1 h, at most 24 h) or the sandbox is killed, and opens nothing else.
   */
  link(port: number, opts: { ttlSeconds?: number } & CallOptions = {}): Promise<PortLink> {
    checkPort(port, 'ports.link');
    checkOptionalInt(opts.ttlSeconds, 'ports.link ttlSeconds', 10);
    const { ttlSeconds, ...call } = opts;
    return this.conn.json<PortLink>('POST', `/v1/sandboxes/${this.sandboxId}/port-links`, {
      json: ttlSeconds === undefined ? { port } : { port, ttlSeconds },
      ...call,
    });
  }

  /**
   * A WebSocket to a server in the sandbox, open when this resolves (the proxy passes the
   * upgrade through, so the server does the handshake itself).
   * @example const ws = await sb.ports.websocket(8765, '/echo'); ws.send('hi');
   */
  websocket(port: number, path = '/', opts: { protocols?: string[]; headers?: Record<string, string> } = {}): Promise<WebSocket> {
    const url = this.url(port, path).replace(/^http/, 'ws');
    const ws = new WebSocket(url, opts.protocols ?? [], { headers: { ...opts.headers, authorization: `Bearer ${this.conn.apiKey}` } });
    return new Promise<WebSocket>((resolve, reject) => {
      ws.once('open', () => resolve(ws));
      ws.once('unexpected-response', (_req, res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => {
          let wire: { error?: { code?: string; message?: string; details?: Record<string, unknown> } } | undefined;
          try {
            wire = JSON.parse(Buffer.concat(parts).toString('utf8')) as typeof wire;
          } catch {
            wire = undefined;
          }
          reject(errorFromWire(res.statusCode ?? 502, wire?.error ?? { message: `the WebSocket upgrade got HTTP ${res.statusCode}` }));
        });
      });
      ws.once('error', (err) => reject(new UnreachableError(`WebSocket to port ${port} failed: ${err.message}`, 'UNREACHABLE', undefined)));
    });
  }

  /**
   * A raw TCP stream to `port` in the sandbox (any protocol: a database, SSH, your own), as a
   * Duplex with half-close passed on. This is what `dsec port-forward` uses.
   */
  async connect(port: number, opts: CallOptions = {}): Promise<Duplex> {
    checkPort(port, 'ports.connect');
    const ws = new WebSocket(`${this.conn.url.replace(/^http/, 'ws')}/v1/sandboxes/${this.sandboxId}/tcp/${port}`, {
      headers: { authorization: `Bearer ${this.conn.apiKey}` },
    });
    // Both attached before any await: bytes right behind ready land in the stream.
    const stream = webSocketStream(ws);
    const ready = new Promise<void>((resolve, reject) => {
      const onMessage = (msg: Buffer, isBinary: boolean): void => {
        if (isBinary) return;
        const m = parsePortFrame(msg);
        if (m?.type === 'ready') {
          ws.off('message', onMessage);
          resolve();
        } else if (m?.type === 'error') reject(errorFromWire((ERROR_CODES as Record<string, number>)[m.error.code] ?? 502, m.error));
      };
      ws.on('message', onMessage);
      ws.once('unexpected-response', (_req, res) =>
        reject(errorFromWire(res.statusCode ?? 502, { message: `the TCP stream to port ${port} was refused: HTTP ${res.statusCode}` })),
      );
      ws.once('error', (err) =>
        reject(new UnreachableError(`TCP stream to port ${port} failed: ${err.message}`, 'UNREACHABLE', undefined)),
      );
      ws.once('close', () =>
        reject(new UnreachableError(`the TCP stream to port ${port} closed before it opened`, 'UNREACHABLE', undefined)),
      );
      opts.signal?.addEventListener('abort', () => reject(new AbortedError(`ports.connect(${port}) was aborted`, 'ABORTED', undefined)), {
        once: true,
      });
    });
    try {
      await ready;
    } catch (err) {
      stream.destroy();
      ws.terminate();
      throw err;
    }
    return stream;
  }
}
