import { createHmac, timingSafeEqual } from 'node:crypto';

/** What a port link opens: one port of one sandbox, until a time. */
export interface PortLinkClaims {
  sandbox: string;
  port: number;
  /** Unix seconds. */
  expires: number;
}

/**
 * Signed, short-lived port links for browsers, which cannot send an API key: the token carries
 * the sandbox, the port and the expiry, and an HMAC-SHA256 of them under a key derived from the
 * cluster token (a secret every control plane of the cluster already shares, so any replica can
 * check a link another made). Nothing is stored: a link cannot be revoked before it expires, but
 * it stops working when its sandbox is killed, and it opens nothing but that one port.
 */
export class PortLinks {
  readonly #key: Buffer;

  constructor(clusterToken: string) {
    this.#key = createHmac('sha256', clusterToken).update('dsec port links v1').digest();
  }

  /** `<sandbox>.<port>.<expiry>.<mac>`: short enough for a URL path segment, readable in a log. */
  sign(claims: PortLinkClaims): string {
    const body = `${claims.sandbox}.${claims.port}.${claims.expires}`;
    return `${body}.${this.#mac(body)}`;
  }

  /** The claims of a valid, unexpired token; undefined for anything else (forged, expired, malformed). */
  verify(token: string, nowSec = Math.floor(Date.now() / 1000)): PortLinkClaims | undefined {
    const m = /^(sb-[a-z0-9-]+)\.(\d{1,5})\.(\d{1,12})\.([A-Za-z0-9_-]+)$/.exec(token);
    if (!m) return undefined;
    const body = `${m[1]}.${m[2]}.${m[3]}`;
    const mac = Buffer.from(m[4]!);
    const want = Buffer.from(this.#mac(body));
    if (mac.length !== want.length || !timingSafeEqual(mac, want)) return undefined;
    const expires = Number(m[3]);
    if (expires < nowSec) return undefined;
    return { sandbox: m[1]!, port: Number(m[2]), expires };
  }

  /** HMAC-SHA256 truncated to 128 bits (22 characters): ample against forgery, short in a URL. */
  #mac(body: string): string {
    return createHmac('sha256', this.#key).update(body).digest().subarray(0, 16).toString('base64url');
  }
}
