import { BEARER_PROTOCOL_PREFIX } from '../http/credentials.js';

/** The subprotocol the pty WebSocket answers with when a client offers it. */
export const PTY_PROTOCOL = 'dsec.pty';

/**
 * ws' handleProtocols for every WebSocket route: `dsec.pty` when offered; otherwise ws' own
 * default, the first one offered, except that the protocol carrying a key (`dsec.bearer.<key>`,
 * read by http/credentials.ts) is never chosen (an answer echoes it back).
 */
export function selectSubprotocol(offered: Set<string>): string | false {
  if (offered.has(PTY_PROTOCOL)) return PTY_PROTOCOL;
  for (const p of offered) if (!p.startsWith(BEARER_PROTOCOL_PREFIX)) return p;
  return false;
}
