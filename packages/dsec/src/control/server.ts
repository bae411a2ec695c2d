import swagger from '@fastify/swagger';
import websocket from '@fastify/websocket';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { requestValidatorCompiler } from './validators.js';
import Fastify, { LogController, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { DSEC_ERROR_HEADER, MAX_FILE_BYTES } from '@dsec/sdk/schema';
import { authenticate } from './api-keys.js';
import { enforceAccess, access } from '../http/access.js';
import type { App } from '../http/app.js';
import { bearerMatches, presentedKey } from '../http/credentials.js';
import { blobRoutes } from './routes/blobs.js';
import { clusterRoutes } from './routes/cluster.js';
import { batchRoutes } from './routes/batches.js';
import type { ControlPlane } from './control-plane.js';
import { e2bRewriteUrl, e2bRoutes } from './e2b/index.js';
import { JSON_BODY_LIMIT, errorHandler } from '../http/http-errors.js';
import { imageRoutes, type ImageRouteDeps } from './routes/images.js';
import { imageRegistryRoutes } from './routes/image-registry.js';
import { execRoutes } from './routes/exec.js';
import { fileRoutes } from './routes/files.js';
import { fnRoutes } from './routes/fn.js';
import { poolRoutes } from './routes/pools.js';
import { ptyRoutes } from './routes/pty.js';
import { portRoutes } from './routes/ports.js';
import { volumeRoutes } from './routes/volumes.js';
import { portTunnelRoutes } from './routes/port-tunnel.js';
import type { PortLinks } from './ports/port-links.js';
import { sandboxRoutes } from './routes/sandboxes.js';
import { trajectoryRoutes } from './routes/trajectory.js';
import { uiRoutes } from './routes/ui.js';
import { systemRoutes } from './routes/system.js';
import { requestIdOptions, useRequestLog } from '../http/request-log.js';
import { edgeOf } from './sandbox-ids.js';
import type { StateStore } from './state-store.js';
import { projectScope } from './routes/access.js';
import { projectRoutes } from './routes/projects.js';
import { selectSubprotocol } from './websocket-bearer.js';
import { e2bSandboxGate } from './e2b/sandbox-access.js';
import { holdBodiesReadWhole } from './body-hold.js';

export interface ServerDeps extends ImageRouteDeps {
  control: ControlPlane;
  /** The cluster's shared secret: opens the blob endpoint and the edge routes (/v1/cluster). */
  clusterToken: string;
  /** Signs port links (under a key derived from the cluster token); the port-link origin checks them. */
  links: PortLinks;
  /** The base URL of the port-link origin (control/ports/ports-server.ts) for a request that makes a link. */
  portsOrigin: (req: FastifyRequest) => string;
  store: StateStore;
  log: Logger;
  /** DSEC_REGISTRY_ALLOW: registry hosts a project key may name in /v1/images/push|pull, besides the cluster's. */
  registryAllow?: readonly string[];
}

export type { App };

/**
 * The HTTP API. Every route declares who may call it (`config.access`, http/access.ts) and one
 * hook decides from the matched route, denying by default; schemas validate every request.
 */
export async function buildServer(deps: ServerDeps): Promise<App> {
  const app = Fastify({
    loggerInstance: deps.log,
    bodyLimit: JSON_BODY_LIMIT,
    logController: new LogController({ disableRequestLogging: true }),
    ...requestIdOptions,
    // E2B's SDK sends every sandbox-side call to this one URL with E2b-Sandbox-Id (control/e2b/).
    rewriteUrl: e2bRewriteUrl,
    // Errors Fastify meets before routing (a malformed %-escape in the URL, an unsupported
    // Content-Type) leave in dsec's own shape too, not Fastify's.
    frameworkErrors: (err, req, reply) => errorHandler(err, req, reply),
  }).withTypeProvider<TypeBoxTypeProvider>();

  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'dsec API', version: '0.1.0', description: 'Sandboxes for agent RL: create, exec, files, kill.' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });

  app.setValidatorCompiler(requestValidatorCompiler());
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler((req, reply) => {
    void reply
      .status(404)
      .send({ error: { code: 'ROUTE_NOT_FOUND', message: `no route ${req.method} ${req.url.split('?')[0]}`, details: {} } });
  });
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer', bodyLimit: MAX_FILE_BYTES }, (_req, body, done) =>
    done(null, body),
  );

  useRequestLog(app, edgeOf);
  observeRequests(app, deps.control);

  enforceAccess(app, {
    apiKey: (req) => authenticate(deps.store, presentedKey(req.headers)),
    clusterToken: (req) => bearerMatches(req.headers.authorization, deps.clusterToken),
    sandboxToken: e2bSandboxGate(deps.control),
  });
  projectScope(app, deps);
  holdBodiesReadWhole(app, deps.control.outputBudget);
  // An answer about an image (built, imported, pulled, snapshotted, tagged, removed) is given once
  // the store has it, so the caller's next call at any replica sees it.
  // Hooks every request passes take a callback rather than being async: an async hook is a promise
  // and a turn of microtasks per request (a create made ~60 promises, read-cache.ts).
  app.addHook('onSend', (_req, _reply, payload, done) => {
    if (!deps.images.dirty) return done(null, payload);
    deps.images.flush().then(
      () => done(null, payload),
      (err: unknown) => done(err as Error),
    );
  });

  await app.register(systemRoutes(deps));
  await app.register(sandboxRoutes(deps));
  await app.register(execRoutes(deps));
  await app.register(fileRoutes(deps));
  await app.register(trajectoryRoutes(deps));
  // WebSocket routes share one @fastify/websocket, in a scope of their own: an upgrade to any other
  // route (the port proxy's) reaches that route's own handler, which passes it on to the sandbox.
  await app.register(async (ws) => {
    await ws.register(websocket, { options: { maxPayload: 1 << 20, handleProtocols: selectSubprotocol } });
    await ws.register(ptyRoutes(deps));
    await ws.register(portTunnelRoutes(deps));
  });
  await app.register(volumeRoutes({ volumes: deps.control.volumes }));
  await app.register(portRoutes({ control: deps.control, links: deps.links, portsOrigin: deps.portsOrigin }));
  await app.register(imageRoutes(deps));
  await app.register(blobRoutes({ layers: deps.images.layers, ...(deps.control.registry ? { registry: deps.control.registry } : {}) }));
  await app.register(
    imageRegistryRoutes({
      images: deps.images,
      projectImages: deps.control.projectImages,
      clusterRegistry: deps.control.registry?.client.ref,
      registryAllow: deps.registryAllow ?? [],
    }),
  );
  await app.register(e2bRoutes(deps));
  await app.register(clusterRoutes(deps));
  await app.register(batchRoutes({ batches: deps.control.batches }));
  await app.register(poolRoutes({ pools: deps.control.pools }));
  await app.register(fnRoutes({ fn: deps.control.fn }));
  await app.register(projectRoutes(deps));
  await app.register(uiRoutes());
  app.get('/v1/openapi.json', { config: access.key, schema: { hide: true } }, async () => app.swagger());
  await app.ready();
  return app;
}

/**
 * Every response is timed by route pattern (`/v1/sandboxes/:id/exec`, never the raw URL, so one
 * series per route) and every error counted by its code; a request's last log line (debug) says
 * how it ended.
 */
function observeRequests(app: App, control: ControlPlane): void {
  const errorCodes = new WeakMap<object, string>();
  app.addHook('onSend', (req, reply, payload, done) => {
    if (reply.statusCode >= 400 && typeof payload === 'string' && payload.startsWith('{"error"')) {
      const code = /^\{"error":\{"code":"([A-Z_]+)"/.exec(payload)?.[1];
      if (code) {
        errorCodes.set(req, code);
        // Says the error is dsec's own: a port's proxied answer (hijacked, never passing here)
        // never carries it, so an SDK tells "nothing listens" from the server's own 502.
        void reply.header(DSEC_ERROR_HEADER, code);
      }
    }
    done(null, payload);
  });
  app.addHook('onResponse', (req, reply, done) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const seconds = reply.elapsedTime / 1000;
    control.metrics.observeRequest(req.method, route, reply.statusCode, seconds);
    const code = errorCodes.get(req);
    if (code) control.metrics.apiError(code, route);
    // Its fields only when the line is written: most servers log at info.
    if (req.log.level === 'debug' || req.log.level === 'trace')
      req.log.debug(
        { method: req.method, route, status: reply.statusCode, ms: Math.round(reply.elapsedTime * 100) / 100, ...(code ? { code } : {}) },
        'request done',
      );
    done();
  });
}
