import { createHmac, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../../api-error.js';

/** What a port link opens: one port of one sandbox of one project, until a time. */
export interface PortLinkClaims {
  sandbox: string;
  port: number;
  /** Unix seconds. */
  expires: number;
  /** The sandbox's project when the link was made: the link opens nothing once the sandbox is another's (a pool claim). */
  project: string;
}

/**
 * Signed, short-lived port links for browsers, which cannot send an API key: the token carries
 * the sandbox, the port, the expiry and the sandbox's project, and an HMAC-SHA256 of them under a
 * key derived from the cluster token (a secret every control plane of the cluster already
 * shares, so any replica can check a link another made). Nothing is stored: a link cannot be
 * revoked before it expires, but it stops working when its sandbox is killed or changes project,
 * and it opens nothing but that one port.
 */
export class PortLinks {
  readonly #key: Buffer;

  constructor(clusterToken: string) {
    // v2: the project joined the signed claims (a v1 link, made without it, no longer verifies).
    this.#key = createHmac('sha256', clusterToken).update('dsec port links v2').digest();
  }

  /** `<sandbox>.<port>.<expiry>.<project>.<mac>`: short enough for a URL path segment, readable in a log. */
  sign(claims: PortLinkClaims): string {
    const body = `${claims.sandbox}.${claims.port}.${claims.expires}.${claims.project}`;
    return `${body}.${this.#mac(body)}`;
  }

  /** The claims of a valid, unexpired token; undefined for anything else (forged, expired, malformed). */
  verify(token: string, nowSec = Math.floor(Date.now() / 1000)): PortLinkClaims | undefined {
    const m = /^(sb-[a-z0-9-]+)\.(\d{1,5})\.(\d{1,12})\.([a-z0-9][a-z0-9-]{0,62})\.([A-Za-z0-9_-]+)$/.exec(token);
    if (!m) return undefined;
    const body = `${m[1]}.${m[2]}.${m[3]}.${m[4]}`;
    const mac = Buffer.from(m[5]!);
    const want = Buffer.from(this.#mac(body));
    if (mac.length !== want.length || !timingSafeEqual(mac, want)) return undefined;
    const expires = Number(m[3]);
    if (expires < nowSec) return undefined;
    return { sandbox: m[1]!, port: Number(m[2]), expires, project: m[4]! };
  }

  /** HMAC-SHA256 truncated to 128 bits (22 characters): ample against forgery, short in a URL. */
  #mac(body: string): string {
    return createHmac('sha256', this.#key).update(body).digest().subarray(0, 16).toString('base64url');
  }
}

/** The path of a request through a link: `/v1/port-links/<token>/<rest>`. */
export const LINK_PATH = /^\/v1\/port-links\/([^/?]+)/;

const INVALID_LINK =
  'this port link is invalid, has expired, or its sandbox changed hands: ask for a new one (POST /v1/sandboxes/{id}/port-links, sandbox.ports.link())';

/**
 * The access check of `link` routes (http/access.ts): the token's signature and expiry, and that
 * the sandbox is still the project's it was made for, on every use. The claims it admitted are
 * kept for the route's handler.
 */
export class PortLinkGate {
  readonly #claims = new WeakMap<FastifyRequest, PortLinkClaims>();

  constructor(
    private readonly links: PortLinks,
    private readonly sandboxes: { projectOf(id: string): Promise<string | undefined> },
  ) {}

  async admit(req: FastifyRequest): Promise<void> {
    const m = LINK_PATH.exec(req.url);
    let token: string | undefined;
    try {
      token = m ? decodeURIComponent(m[1]!) : undefined;
    } catch {
      token = undefined;
    }
    const claims = token === undefined ? undefined : this.links.verify(token);
    if (!claims || (await this.sandboxes.projectOf(claims.sandbox)) !== claims.project) throw new ApiError('UNAUTHORIZED', INVALID_LINK);
    this.#claims.set(req, claims);
  }

  /** What the link of an admitted request opens. */
  claims(req: FastifyRequest): PortLinkClaims {
    const c = this.#claims.get(req);
    if (!c) throw new ApiError('UNAUTHORIZED', INVALID_LINK);
    return c;
  }
}
