import type { FastifyPluginAsync } from 'fastify';
import { ErrorBody, NodeList } from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';

export function systemRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  return async (app) => {
    app.get('/healthz', { schema: { hide: true } }, async () => ({ ok: true }));
    app.get('/metrics', { schema: { hide: true } }, async (_req, reply) => {
      const m = deps.control.metrics;
      const running = (await deps.control.list({ status: 'running' })).length;
      const text = [
        '# TYPE dsec_sandboxes_running gauge',
        `dsec_sandboxes_running ${running}`,
        '# TYPE dsec_sandbox_creates_total counter',
        `dsec_sandbox_creates_total ${m.creates}`,
        '# TYPE dsec_sandbox_create_seconds_total counter',
        `dsec_sandbox_create_seconds_total ${(m.createMsTotal / 1000).toFixed(6)}`,
        '# TYPE dsec_execs_total counter',
        `dsec_execs_total ${m.execs}`,
        '# TYPE dsec_exec_seconds_total counter',
        `dsec_exec_seconds_total ${(m.execMsTotal / 1000).toFixed(6)}`,
        '',
      ].join('\n');
      return reply.type('text/plain; version=0.0.4').send(text);
    });
    app.get(
      '/v1/nodes',
      { schema: { tags: ['nodes'], summary: 'Edges, their capacity and their layer cache', response: { 200: NodeList, 401: ErrorBody } } },
      async () => ({ nodes: await deps.control.nodes() }),
    );
  };
}
