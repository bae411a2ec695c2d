import type { FastifyError, FastifyInstance, FastifyRequest, RouteOptions } from 'fastify';
import { ApiError } from '../api-error.js';
import { checkRequestTarget } from './request-target.js';
import { thenOrNow, type MaybePromise } from '../maybe-promise.js';

/**
 * Who may call a route. Every route dsec serves declares one in its options
 * (`config: access.key`); one hook (`enforceAccess`) decides from the route the router matched,
 * never from the raw URL, and a route that declares nothing answers nobody.
 * - `public`: anyone (health, the dashboard's static files, Prometheus' scrape).
 * - `key`: any valid API key; the caller's project scope is the service's to apply.
 * - `admin`: an admin key; `what` names the act in the 403.
 * - `cluster`: the cluster's join token (edges, and the control plane calling an edge).
 * - `clusterOrAdmin`: the cluster token or an admin key (layer blobs: a digest is not a capability).
 * - `link`: a signed, unexpired port link in the path (browsers, which send no key).
 * - `sandboxToken`: E2B's envd surface: `E2b-Sandbox-Id` and the sandbox's own access token.
 */
export type Access =
  | { kind: 'public' }
  | { kind: 'key' }
  | { kind: 'admin'; what: string }
  | { kind: 'cluster' }
  | { kind: 'clusterOrAdmin' }
  | { kind: 'link' }
  | { kind: 'sandboxToken' };

/** Who a request with an API key is. */
export interface Caller {
  keyId: string;
  project: string;
  /** Manages projects and keys, builds and deletes shared images, sees every project's sandboxes. */
  admin: boolean;
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Who may call this route: see http/access.ts. A route without it answers nobody. */
    access?: Access;
  }
  interface FastifyRequest {
    /**
     * Who is calling, for routes declared `key` or `admin`. Reading it on a request no key
     * authenticated throws UNAUTHORIZED (a route that forgot its declaration fails closed).
     */
    readonly caller: Caller;
    /** The caller when a key came with the request, else undefined (for routes that take several kinds). */
    readonly callerIfAny: Caller | undefined;
  }
}

/** Route option fragments: `{ config: access.key, schema: … }`. */
export const access = {
  public: { access: { kind: 'public' } },
  key: { access: { kind: 'key' } },
  admin: (what: string) => ({ access: { kind: 'admin', what } }),
  cluster: { access: { kind: 'cluster' } },
  clusterOrAdmin: { access: { kind: 'clusterOrAdmin' } },
  link: { access: { kind: 'link' } },
  sandboxToken: { access: { kind: 'sandboxToken' } },
} as const satisfies Record<string, { access: Access } | ((what: string) => { access: Access })>;

/** How each kind of credential is checked: the daemon that serves the routes supplies these. */
export interface Gatekeeper {
  /** The caller a request's API key names (Authorization: Bearer, X-API-Key, or a WebSocket subprotocol). */
  apiKey?(req: FastifyRequest): MaybePromise<Caller | undefined>;
  /** Whether the request carries the cluster token. */
  clusterToken(req: FastifyRequest): boolean;
  /** Checks a port link's signature and expiry (and records its claims for the route); throws when it does not hold. */
  link?(req: FastifyRequest): Promise<void>;
  /** Checks E2B's sandbox access token (or a signed file URL); throws when it does not hold. */
  sandboxToken?(req: FastifyRequest): Promise<void>;
}

const CALLER = Symbol('dsec.caller');

/** Every server's routes, as registered, so tests can walk the whole surface (declaredRoutes). */
const serverRoutes = new WeakMap<object, RouteOptions[]>();

/** The routes a server built with enforceAccess serves: method, URL pattern and declared access. */
export function declaredRoutes(
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- any server's generics
  app: FastifyInstance<any, any, any, any, any>,
): { method: string; url: string; access: Access | undefined }[] {
  return (serverRoutes.get(app) ?? []).flatMap((r) =>
    (Array.isArray(r.method) ? r.method : [r.method]).map((method) => ({ method: String(method), url: r.url, access: r.config?.access })),
  );
}
type WithCaller = { [CALLER]?: Caller };

const unauthorized = (message: string): ApiError => new ApiError('UNAUTHORIZED', message);

/** The declared access of the route a request matched (undefined for an unmatched request or an undeclared route). */
export function accessOf(req: FastifyRequest): Access | undefined {
  return req.routeOptions.config?.access;
}

/**
 * Installs the access pipeline on a server, before any route is registered: checks the request
 * target, then the matched route's declaration, and denies by default; `unmatched` is the access
 * a request no route matched needs before it hears 404 (none: anyone hears it). At start-up (`onReady`)
 * it refuses to serve if any route was registered without a declaration.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function enforceAccess(app: FastifyInstance<any, any, any, any, any>, gate: Gatekeeper, opts: { unmatched?: Access } = {}): void {
  app.decorateRequest('caller', {
    getter(this: FastifyRequest) {
      const c = (this as unknown as WithCaller)[CALLER];
      if (!c) throw unauthorized('this call takes an API key: send Authorization: Bearer <key>');
      return c;
    },
  });
  app.decorateRequest('callerIfAny', {
    getter(this: FastifyRequest) {
      return (this as unknown as WithCaller)[CALLER];
    },
  });

  const routes: RouteOptions[] = [];
  serverRoutes.set(app, routes);
  app.addHook('onRoute', (route) => {
    routes.push(route as RouteOptions);
  });
  app.addHook('onReady', async () => {
    const undeclared = routes.filter((r) => !r.config?.access).map((r) => `${String(r.method)} ${r.url}`);
    if (undeclared.length)
      throw new Error(`routes without an access declaration (config.access, see http/access.ts): ${undeclared.join(', ')}`);
  });

  const check = (req: FastifyRequest): void | Promise<void> => {
    // A request no route matched goes to the 404 handler. The public API's routes are public
    // knowledge (its OpenAPI document), so that 404 reveals nothing; an edge answers strangers
    // 401 whatever they ask (opts.unmatched), so it does not even tell which routes it serves.
    if (req.is404) return opts.unmatched ? admit(req, opts.unmatched, gate) : undefined;
    const declared = accessOf(req);
    if (!declared) throw new ApiError('ROUTE_NOT_FOUND', `no route ${req.method} ${req.url.split('?')[0]}`);
    checkRequestTarget(req);
    return admit(req, declared, gate);
  };

  // A callback hook with the key's check answered at once when its key is kept in memory
  // (control/store/read-cache.ts): an async hook is a promise and a turn of microtasks for every
  // request, and an API key's check is in front of every request of the public API.
  app.addHook('onRequest', (req, _reply, done) => {
    let pending: void | Promise<void>;
    try {
      pending = check(req);
    } catch (err) {
      done(err as FastifyError);
      return;
    }
    if (pending)
      pending.then(
        () => done(),
        (err: unknown) => done(err as FastifyError),
      );
    else done();
  });
}

/**
 * The caller the request's API key names, kept on the request, then `check`ed: at once when the
 * key's check answered at once.
 */
function withCaller(req: FastifyRequest, gate: Gatekeeper, check: (caller: Caller | undefined) => void): void | Promise<void> {
  return thenOrNow(gate.apiKey?.(req), (caller) => {
    if (caller) (req as unknown as WithCaller)[CALLER] = caller;
    check(caller);
  });
}

function admit(req: FastifyRequest, declared: Access, gate: Gatekeeper): void | Promise<void> {
  switch (declared.kind) {
    case 'public':
      return;
    case 'key':
      return withCaller(req, gate, (caller) => {
        if (!caller)
          throw unauthorized('missing, unknown or revoked API key: send Authorization: Bearer <key> (see client.json in the data dir)');
      });
    case 'admin':
      return withCaller(req, gate, (caller) => {
        if (!caller) throw unauthorized(`${declared.what} takes an admin key: send Authorization: Bearer <admin key>`);
        if (!caller.admin)
          throw new ApiError(
            'FORBIDDEN',
            `${declared.what} takes an admin key; this key is project ${caller.project}'s (see docs/PROJECTS.md)`,
            { project: caller.project },
          );
      });
    case 'cluster':
      if (!gate.clusterToken(req))
        throw unauthorized('this route is for the cluster: send the cluster token (Authorization: Bearer <token>)');
      return;
    case 'clusterOrAdmin':
      if (gate.clusterToken(req)) return;
      return withCaller(req, gate, (caller) => {
        if (!caller) throw unauthorized('this route takes the cluster token or an admin key (Authorization: Bearer …)');
        if (!caller.admin)
          throw new ApiError('FORBIDDEN', `this route takes the cluster token or an admin key; this key is project ${caller.project}'s`, {
            project: caller.project,
          });
      });
    case 'link':
      if (!gate.link) throw unauthorized('this server serves no port links');
      return gate.link(req);
    case 'sandboxToken':
      if (!gate.sandboxToken) throw unauthorized('this server serves no E2B sandbox routes');
      return gate.sandboxToken(req);
  }
}
