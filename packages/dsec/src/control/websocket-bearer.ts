import type { IncomingHttpHeaders } from 'node:http';

/** The subprotocol the pty WebSocket answers with when a client offers it. */
export const PTY_PROTOCOL = 'dsec.pty';

/** A browser offers its API key as the subprotocol `dsec.bearer.<key>` (it cannot set headers on a WebSocket). */
export const BEARER_PROTOCOL_PREFIX = 'dsec.bearer.';

/**
 * The Authorization of a request: its header, or, on a WebSocket upgrade without one, the key a
 * browser offered as a `dsec.bearer.<key>` subprotocol (as Kubernetes carries bearer tokens for
 * browsers). Kept out of the URL so proxies and access logs never hold it. The server never
 * echoes that subprotocol back: it answers with `dsec.pty`.
 */
export function requestAuthorization(headers: IncomingHttpHeaders): string | undefined {
  if (headers.authorization) return headers.authorization;
  if ((headers.upgrade ?? '').toLowerCase() !== 'websocket') return undefined;
  const offered = String(headers['sec-websocket-protocol'] ?? '').split(',');
  const bearer = offered.map((p) => p.trim()).find((p) => p.startsWith(BEARER_PROTOCOL_PREFIX));
  return bearer ? `Bearer ${bearer.slice(BEARER_PROTOCOL_PREFIX.length)}` : undefined;
}

/**
 * ws' handleProtocols for every WebSocket route: `dsec.pty` when offered; otherwise ws' own
 * default, the first one offered, except that the protocol carrying a key is never chosen (an
 * answer echoes it back).
 */
export function selectSubprotocol(offered: Set<string>): string | false {
  if (offered.has(PTY_PROTOCOL)) return PTY_PROTOCOL;
  for (const p of offered) if (!p.startsWith(BEARER_PROTOCOL_PREFIX)) return p;
  return false;
}
