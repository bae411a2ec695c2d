import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { DEFAULT_PROJECT, PortLink, PortLinkRequest, PortWaitRequest, PortWaitResult, SandboxIdParams } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ControlPlane } from '../control-plane.js';
import { isUpgrade, proxyRequest, proxyUpgrade, writeUpgradeError } from '../ports/http-proxy.js';
import { portLinkCaller, type Caller } from '../service/callers.js';
import { LINK_PATH, type PortLinkGate, type PortLinks } from '../ports/port-links.js';
import { access } from '../../http/access.js';
import { errorResponses as errors } from './error-responses.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';

const PORT_PATH = /^\/v1\/sandboxes\/([^/?]+)\/ports\/([^/?]+)/;

/** The sandbox-side path of a proxied URL: what follows the public prefix, always starting with `/`. */
function rest(url: string, prefix: string): string {
  const r = url.slice(prefix.length);
  return r.startsWith('/') ? r : `/${r}`;
}

function parsePort(raw: string): number {
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 1 || port > 65535)
    throw new ApiError('INVALID_REQUEST', `port must be an integer from 1 to 65535, got "${raw}"`, { field: 'port' });
  return port;
}

/** @fastify/websocket keeps the bytes that came after an upgrade request's head under a symbol of its own. */
function upgradeHead(req: FastifyRequest): Buffer | undefined {
  const raw = req.raw as unknown as Record<symbol, unknown>;
  const sym = Object.getOwnPropertySymbols(raw).find((s) => s.description === 'ws-head');
  const head = sym ? raw[sym] : undefined;
  return Buffer.isBuffer(head) ? head : undefined;
}

/** Proxies one request (or upgrade) to a port of a sandbox, through its edge. */
async function proxy(
  control: ControlPlane,
  caller: Caller,
  req: FastifyRequest,
  reply: FastifyReply,
  id: string,
  port: number,
  prefix: string,
): Promise<void> {
  const target = { path: rest(req.raw.url ?? '/', prefix), prefix };
  if (isUpgrade(req.headers)) {
    void reply.hijack();
    const socket = req.raw.socket;
    let conn;
    try {
      conn = await control.network.openPort(caller, id, port);
    } catch (err) {
      writeUpgradeError(socket, err);
      return;
    }
    await proxyUpgrade(req.raw, socket, upgradeHead(req), conn, target);
    return;
  }
  const conn = await control.network.openPort(caller, id, port); // a refused port is a JSON error, before anything is sent
  void reply.hijack();
  await proxyRequest(req.raw, reply.raw, conn, target);
}

/**
 * The port proxy on the API's origin: `/v1/sandboxes/{id}/ports/{port}/…` (API key) reaches a
 * TCP port on the sandbox's own loopback, through its edge (ControlPlane.openPort →
 * EdgeApi.openPort); signed links are made here and served on an origin of their own
 * (portLinkRoutes). HTTP requests are proxied one connection each,
 * streamed both ways; an upgrade (WebSocket) becomes a byte pipe after its request head. The
 * bodies are the sandbox's own, so these routes take any content type unparsed and are left out
 * of the OpenAPI document (docs/API.md describes them).
 */
export function portRoutes(deps: {
  control: ControlPlane;
  links: PortLinks;
  portsOrigin: (req: FastifyRequest) => string;
}): FastifyPluginAsync {
  const { control, links, portsOrigin } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();

    app.post(
      '/v1/sandboxes/:id/port-links',
      {
        config: access.key,
        schema: {
          tags: ['ports'],
          summary: 'A signed, expiring URL that opens one port of the sandbox without an API key (for a browser)',
          params: SandboxIdParams,
          body: PortLinkRequest,
          response: { 201: PortLink, ...errors },
        },
      },
      async (req, reply) => {
        const s = await control.sandboxes.get(req.caller, req.params.id);
        if (s.status !== 'running' && s.status !== 'paused')
          throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${s.id} is ${s.status}`, { id: s.id, status: s.status });
        // A ready pool sandbox belongs to nobody yet: a link made now would open the page of
        // whichever project claims it (exec and files refuse it for the same reason).
        const pool = control.pools.unclaimedIn(s.id);
        if (pool !== undefined)
          throw new ApiError(
            'SANDBOX_NOT_RUNNING',
            `sandbox ${s.id} waits unclaimed in pool ${pool}: claim one with a create naming the pool first`,
            { id: s.id, pool },
          );
        const ttl = req.body.ttlSeconds ?? 3600;
        const expires = Math.floor(Date.now() / 1000) + ttl;
        const token = links.sign({ sandbox: s.id, port: req.body.port, expires, project: s.project ?? DEFAULT_PROJECT });
        // On the port-link origin, never the API's: a page served through the link must not share
        // the dashboard's origin (its sessionStorage key, service workers over /ui/ and /v1/).
        const url = `${portsOrigin(req)}/v1/port-links/${token}/`;
        return reply.status(201).send({ url, port: req.body.port, expiresAt: new Date(expires * 1000).toISOString() });
      },
    );

    app.post(
      '/v1/sandboxes/:id/port-waits',
      {
        config: access.key,
        schema: {
          tags: ['ports'],
          summary: 'Waits until something in the sandbox accepts connections on a port (nothing is sent to it)',
          description:
            'For a server started in the background (a process) before the first request through the port proxy: answers once a connection to the port is accepted (and closed at once), or 504 PORT_WAIT_TIMEOUT after timeoutMs.',
          params: SandboxIdParams,
          body: PortWaitRequest,
          response: { 200: PortWaitResult, ...errors },
        },
      },
      async (req, reply) => {
        const hangup = abortOnHangup(reply);
        try {
          return await control.network.waitForPort(req.caller, req.params.id, req.body.port, req.body.timeoutMs ?? 30_000, hangup.signal);
        } finally {
          hangup.done();
        }
      },
    );

    const byKey = async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
      const m = PORT_PATH.exec(req.url)!;
      const id = decodeURIComponent(m[1]!);
      await proxy(control, req.caller, req, reply, id, parsePort(decodeURIComponent(m[2]!)), m[0]);
    };
    const byKeyOpts = { config: access.key, schema: { hide: true } };
    await base.register(async (scope) => {
      // Proxied as it came: no body parsing in this scope.
      scope.removeAllContentTypeParsers();
      scope.addContentTypeParser('*', (_req, _payload, done) => done(null));
      for (const path of ['/v1/sandboxes/:id/ports/:port', '/v1/sandboxes/:id/ports/:port/*']) scope.all(path, byKeyOpts, byKey);
    });
    // A link on the API's origin (one made before links had an origin of their own, or typed by
    // hand) is sent to the port-link origin; nothing of the sandbox is served here.
    base.all('/v1/port-links/*', { config: access.public, schema: { hide: true } }, async (req, reply) =>
      reply.redirect(`${portsOrigin(req)}${req.url}`, 307),
    );
  };
}

/**
 * The port-link origin's one route (control/ports/ports-server.ts): `/v1/port-links/{token}/…`,
 * checked by the access hook (PortLinkGate: signature, expiry, the sandbox's project), proxied as
 * `/v1/sandboxes/{id}/ports/{port}/…` is.
 */
export function portLinkRoutes(deps: { control: ControlPlane; linkGate: PortLinkGate }): FastifyPluginAsync {
  const { control, linkGate } = deps;
  return async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_req, _payload, done) => done(null));
    // A wildcard, not a :token parameter: parameters are capped at 100 characters.
    scope.all('/v1/port-links/*', { config: access.link, schema: { hide: true } }, async (req, reply) => {
      const claims = linkGate.claims(req);
      await proxy(control, portLinkCaller(claims), req, reply, claims.sandbox, claims.port, LINK_PATH.exec(req.url)![0]);
    });
  };
}
