import websocket from '@fastify/websocket';
import Fastify, { LogController } from 'fastify';
import type { Logger } from 'pino';
import { enforceAccess } from '../../http/access.js';
import type { ControlPlane } from '../control-plane.js';
import { errorHandler } from '../../http/http-errors.js';
import { requestIdOptions, useRequestLog } from '../../http/request-log.js';
import { portLinkRoutes } from '../routes/ports.js';
import type { App } from '../../http/app.js';
import type { PortLinkGate } from './port-links.js';

/**
 * The port-link origin: a listener of its own (DSEC_PORTS_LISTEN) that serves nothing but
 * `/v1/port-links/{token}/…`. A page a sandbox serves runs with this origin, so it shares
 * nothing a browser keys by origin with the API and the dashboard: not the dashboard's
 * sessionStorage (its API key), not its service-worker scopes, not its CSP's `'self'`.
 */
export async function buildPortsServer(deps: { control: ControlPlane; linkGate: PortLinkGate; log: Logger }): Promise<App> {
  const app = Fastify({
    loggerInstance: deps.log,
    logController: new LogController({ disableRequestLogging: true }),
    ...requestIdOptions,
    frameworkErrors: (err, req, reply) => errorHandler(err, req, reply),
  });
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler((req, reply) => {
    void reply.status(404).send({
      error: {
        code: 'ROUTE_NOT_FOUND',
        message: `this is dsec's port-link origin: it serves /v1/port-links/{token}/… only, not ${req.method} ${req.url.split('?')[0]}`,
        details: {},
      },
    });
  });
  useRequestLog(app, () => undefined);
  enforceAccess(app, { clusterToken: () => false, link: (req) => deps.linkGate.admit(req) });
  // Upgrades (a page's WebSocket) reach the link route through @fastify/websocket's upgrade
  // handling, registered in a scope of its own as on the API's server: inside its scope it
  // would answer an upgrade to a route without a WebSocket handler itself (101, then a close);
  // outside, the link route gets it, hijacks it and passes the bytes on to the sandbox.
  await app.register(async (ws) => {
    await ws.register(websocket, { options: { maxPayload: 1 << 20 } });
  });
  await app.register(portLinkRoutes({ control: deps.control, linkGate: deps.linkGate }));
  await app.ready();
  return app as unknown as App;
}
