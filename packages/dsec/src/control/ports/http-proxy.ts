import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { DSEC_ERROR_HEADER } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { bridge } from '../../edge/protocol/port-stream.js';
import { withoutCredential } from '../../http/credentials.js';

/** Where a proxied request goes: the path in the sandbox, and the prefix it was reached under. */
export interface ProxyTarget {
  /** Path and query as the server in the sandbox sees them (always starts with `/`). */
  path: string;
  /** The public prefix the request came through (X-Forwarded-Prefix), e.g. `/v1/sandboxes/sb-…/ports/8000`. */
  prefix: string;
}

/** Headers that describe one hop, not the message (RFC 9110 §7.6.1), never forwarded. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/**
 * The request's headers as the sandbox gets them: hop-by-hop headers dropped (an upgrade keeps
 * Connection/Upgrade), every credential dsec reads dropped whatever header carries it (the
 * sandbox must never see a key: http/credentials.ts), cookies named dsec* dropped (the
 * platform's, not the app's), and X-Forwarded-* added.
 */
export function forwardHeaders(req: IncomingMessage, prefix: string, upgrade: boolean): [string, string][] {
  const out: [string, string][] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    let value = withoutCredential(name, raw[i + 1]!);
    if (value === undefined || lower.startsWith('x-forwarded-')) continue;
    if (HOP_BY_HOP.has(lower) && !(upgrade && (lower === 'connection' || lower === 'upgrade'))) continue;
    if (lower === 'cookie') {
      value = value
        .split(';')
        .map((c) => c.trim())
        .filter((c) => c && !/^dsec/i.test(c))
        .join('; ');
      if (!value) continue;
    }
    out.push([name, value]);
  }
  const encrypted = (req.socket as { encrypted?: boolean }).encrypted === true;
  out.push(['X-Forwarded-For', req.socket.remoteAddress ?? '']);
  out.push(['X-Forwarded-Proto', encrypted ? 'https' : 'http']);
  if (req.headers.host) out.push(['X-Forwarded-Host', req.headers.host]);
  out.push(['X-Forwarded-Prefix', prefix]);
  return out;
}

/**
 * A sandbox's cookie as the caller's browser gets it: scoped to the public prefix the request
 * came through (`Path=/app` → `Path=<prefix>/app`; none → `Path=<prefix>/`), without `Domain`.
 * Every link of every project shares one port-link origin: unscoped, a cookie one sandbox set
 * would be sent to every other sandbox's link (and, as cookies ignore ports, to the API's host).
 */
export function scopeCookie(value: string, prefix: string): string {
  const [pair, ...attrs] = value.split(';');
  let path = '/';
  const kept: string[] = [];
  for (const a of attrs) {
    const t = a.trim();
    const eq = t.indexOf('=');
    const name = (eq < 0 ? t : t.slice(0, eq)).toLowerCase();
    if (name === 'path') path = eq < 0 ? '/' : t.slice(eq + 1).trim() || '/';
    else if (name !== 'domain' && t !== '') kept.push(t);
  }
  if (!path.startsWith('/')) path = `/${path}`;
  return [pair!.trim(), `Path=${prefix.replace(/\/$/, '')}${path}`, ...kept].join('; ');
}

/**
 * The response's headers for the caller: hop-by-hop headers dropped (Node frames the body
 * itself), and what would let a sandbox's page act beyond its own link: `Service-Worker-Allowed`
 * (a worker scoped over the origin), cookies named dsec* (the platform's names), and every other
 * cookie scoped to the request's prefix (scopeCookie).
 */
export function responseHeaders(raw: string[], prefix: string): string[] {
  const out: string[] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    // x-dsec-error marks dsec's own errors: a server in the sandbox must not claim to be dsec.
    if (HOP_BY_HOP.has(lower) || lower === 'service-worker-allowed' || lower === DSEC_ERROR_HEADER) continue;
    if (lower === 'set-cookie') {
      if (/^\s*dsec/i.test(raw[i + 1]!)) continue;
      out.push(raw[i]!, scopeCookie(raw[i + 1]!, prefix));
      continue;
    }
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

export function isUpgrade(headers: IncomingHttpHeaders): boolean {
  return typeof headers.upgrade === 'string' && /(^|,)\s*upgrade\s*(,|$)/i.test(headers.connection ?? '');
}

/**
 * Proxies one HTTP request over `conn` (a fresh connection to the port, used for this request
 * only) and streams the answer back as it comes: chunked and long-lived responses (server-sent
 * events, logs) reach the caller chunk by chunk. Resolves when the exchange is over.
 */
export function proxyRequest(req: IncomingMessage, res: ServerResponse, conn: Duplex, target: ProxyTarget): Promise<void> {
  return new Promise<void>((resolve) => {
    const headers = forwardHeaders(req, target.prefix, false);
    headers.push(['Connection', 'close']);
    // Lenient parsing of the answer: servers agents write (and busybox httpd's CGI) end header
    // lines with a bare LF. Each request has a connection of its own, so a sloppy answer cannot
    // desynchronise another; what the caller gets is re-framed by Node.
    const upstream = httpRequest({
      method: req.method,
      path: target.path,
      headers: headers.flat(),
      setHost: false,
      insecureHTTPParser: true,
      createConnection: () => conn as never,
    });
    const fail = (why: string): void => {
      if (!res.headersSent) {
        const e = new ApiError('PORT_BAD_RESPONSE', `the server on port ${target.prefix.split('/').pop()} in the sandbox ${why}`);
        res.writeHead(502, { 'content-type': 'application/json', connection: 'close', [DSEC_ERROR_HEADER]: e.code });
        res.end(JSON.stringify({ error: { code: e.code, message: e.message, details: {} } }));
      } else {
        res.destroy();
      }
      conn.destroy();
      resolve();
    };
    upstream.on('error', (err: NodeJS.ErrnoException) => fail(`did not answer the request (${err.code ?? err.message})`));
    upstream.on('response', (up) => {
      res.writeHead(up.statusCode ?? 502, up.statusMessage, responseHeaders(up.rawHeaders, target.prefix));
      res.flushHeaders();
      up.pipe(res);
      up.on('error', () => res.destroy());
      up.on('end', () => resolve());
    });
    // The caller went away: the connection into the sandbox goes too.
    res.on('close', () => {
      if (!res.writableFinished) {
        upstream.destroy();
        conn.destroy();
      }
      resolve();
    });
    req.pipe(upstream);
  });
}

/**
 * Proxies an HTTP upgrade (a WebSocket): the request head goes to the sandbox as it came (less
 * the API key), then bytes flow both ways untouched, so the server in the sandbox answers the
 * handshake itself (101, subprotocols, extensions) and frames are never re-encoded.
 */
export async function proxyUpgrade(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer | undefined,
  conn: Duplex,
  target: ProxyTarget,
): Promise<void> {
  const lines = [
    `${req.method ?? 'GET'} ${target.path} HTTP/1.1`,
    ...forwardHeaders(req, target.prefix, true).map(([k, v]) => `${k}: ${v}`),
    '',
    '',
  ];
  conn.write(lines.join('\r\n'));
  if (head?.length) conn.write(head);
  await bridge(socket, conn);
}

/** An error answer written straight on a socket whose request asked for an upgrade. */
export function writeUpgradeError(socket: Duplex, err: unknown): void {
  const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
  const body = JSON.stringify({ error: { code: e.code, message: e.message, details: e.details } });
  socket.end(
    `HTTP/1.1 ${e.status} ${e.code}\r\nContent-Type: application/json\r\n${DSEC_ERROR_HEADER}: ${e.code}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
