import type { FastifyPluginAsync } from 'fastify';
import { ErrorBody, NodeList } from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import { access } from '../../http/access.js';

export function systemRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  return async (app) => {
    app.get('/healthz', { config: access.public, schema: { hide: true } }, async () => ({ ok: true }));
    // Outside /v1, so it needs no API key: Prometheus scrapes it as it is (see docs/OPERATIONS.md).
    app.get('/metrics', { config: access.public, schema: { hide: true } }, async (_req, reply) => {
      const { contentType, text } = await deps.control.metrics.render();
      return reply.type(contentType).send(text);
    });
    app.get(
      '/v1/nodes',
      {
        config: access.key,
        schema: { tags: ['nodes'], summary: 'Edges, their capacity and their layer cache', response: { 200: NodeList, 401: ErrorBody } },
      },
      async () => ({ nodes: await deps.control.nodes.nodes() }),
    );
  };
}
