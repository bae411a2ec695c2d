import { timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';

/** A browser offers its API key as the WebSocket subprotocol `dsec.bearer.<key>` (it cannot set headers on a WebSocket). */
export const BEARER_PROTOCOL_PREFIX = 'dsec.bearer.';

/**
 * Every header dsec reads a credential from. The port proxy removes all of them before a request
 * reaches a sandbox (stripCredentials), so this list is the one place to add a new carrier.
 * - `authorization`: `Bearer <API key | cluster token>`;
 * - `x-api-key`: E2B's SDK sends its key here;
 * - `x-access-token`: E2B's per-sandbox envd token;
 * - `sec-websocket-protocol`: only its `dsec.bearer.<key>` entries (the rest is the page's own).
 */
const CREDENTIAL_HEADERS = ['authorization', 'x-api-key', 'x-access-token'] as const;

/** The token of an `Authorization: Bearer <token>` header. */
export function bearerToken(authorization: string | undefined): string | undefined {
  return /^Bearer\s+(\S+)$/i.exec(authorization ?? '')?.[1];
}

/** Constant-time check of an `Authorization: Bearer <token>` header against a secret (the cluster token). */
export function bearerMatches(authorization: string | undefined, secret: string): boolean {
  const t = bearerToken(authorization);
  if (t === undefined) return false;
  const a = Buffer.from(t);
  const b = Buffer.from(secret);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The `dsec.bearer.<key>` subprotocol of a WebSocket upgrade, if one was offered. */
function subprotocolKey(headers: IncomingHttpHeaders): string | undefined {
  if ((headers.upgrade ?? '').toLowerCase() !== 'websocket') return undefined;
  const offered = String(headers['sec-websocket-protocol'] ?? '').split(',');
  const bearer = offered.map((p) => p.trim()).find((p) => p.startsWith(BEARER_PROTOCOL_PREFIX));
  return bearer?.slice(BEARER_PROTOCOL_PREFIX.length);
}

/**
 * The API key a request presents: `Authorization: Bearer`, else `X-API-Key` (E2B's SDK), else on
 * a WebSocket upgrade the `dsec.bearer.<key>` subprotocol (as Kubernetes carries bearer tokens
 * for browsers), kept out of the URL so proxies and access logs never hold it.
 */
export function presentedKey(headers: IncomingHttpHeaders): string | undefined {
  // An empty Authorization is no header at all (some clients send one blank beside X-API-Key).
  if (headers.authorization) return bearerToken(headers.authorization);
  const x = headers['x-api-key'];
  if (typeof x === 'string' && x !== '') return x;
  return subprotocolKey(headers);
}

/**
 * A request header as it may leave dsec for a sandbox: undefined for a credential header (see
 * CREDENTIAL_HEADERS), a WebSocket protocol list without its `dsec.bearer.*` entries, anything
 * else as it came.
 */
export function withoutCredential(name: string, value: string): string | undefined {
  const lower = name.toLowerCase();
  if ((CREDENTIAL_HEADERS as readonly string[]).includes(lower)) return undefined;
  if (lower !== 'sec-websocket-protocol') return value;
  const kept = value
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p !== '' && !p.startsWith(BEARER_PROTOCOL_PREFIX));
  return kept.length ? kept.join(', ') : undefined;
}
