import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import fastifyStatic from '@fastify/static';
import type { FastifyPluginAsync } from 'fastify';
import { access } from '../../http/access.js';

/** Where the dashboard's build lands (packages/dsec/ui → dist/ui; see ui/README.md). */
export const UI_DIR = fileURLToPath(new URL('../../../ui/', import.meta.url));

/**
 * Pages may run only the dashboard's own scripts and talk only to this origin (the API and the
 * pty WebSocket). Styles may be inline because xterm.js writes its theme as <style> elements.
 */
const CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
  "form-action 'self'",
].join('; ');

/**
 * The web dashboard at /ui/: static files built by Vite (no CDN, nothing fetched from elsewhere).
 * The files are public, as a login page is; everything they show comes from the /v1 API with the
 * API key the user signs in with.
 */
export function uiRoutes(opts: { dir?: string } = {}): FastifyPluginAsync {
  const dir = opts.dir ?? UI_DIR;
  return async (app) => {
    // The dashboard's files are public, as a login page is: every route this plugin makes (the
    // static plugin's own included, which take no route options) is declared so here.
    app.addHook('onRoute', (route) => {
      route.config = { ...route.config, ...access.public };
    });
    if (!existsSync(`${dir}/index.html`)) {
      const notBuilt = {
        error: {
          code: 'ROUTE_NOT_FOUND',
          message: `the dashboard is not built (no ${dir}index.html): run ./scripts/setup, which builds it`,
          details: {},
        },
      };
      app.get('/ui', { schema: { hide: true } }, async (_req, reply) => reply.status(404).send(notBuilt));
      app.get('/ui/*', { schema: { hide: true } }, async (_req, reply) => reply.status(404).send(notBuilt));
      return;
    }
    app.addHook('onSend', async (req, reply) => {
      if (req.url === '/ui' || req.url.startsWith('/ui/')) {
        void reply.header('content-security-policy', CSP);
        void reply.header('x-content-type-options', 'nosniff');
        void reply.header('referrer-policy', 'no-referrer');
      }
    });
    await app.register(fastifyStatic, { root: dir, prefix: '/ui/', index: 'index.html', schemaHide: true, cacheControl: false });
    // Relative, so it also lands right behind a proxy that mounts the control plane under a path.
    app.get('/ui', { schema: { hide: true } }, async (_req, reply) => reply.redirect('ui/'));
    // Hashed asset names (assets/index-<hash>.js) may be cached for good; index.html never is.
    app.addHook('onSend', async (req, reply) => {
      if (req.url.startsWith('/ui/assets/')) void reply.header('cache-control', 'public, max-age=31536000, immutable');
      else if (req.url === '/ui' || req.url.startsWith('/ui/')) void reply.header('cache-control', 'no-cache');
    });
  };
}
