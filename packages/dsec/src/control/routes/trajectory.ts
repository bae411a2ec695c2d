import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ReplayResult, SandboxIdParams, Trajectory, TrajectoryQuery } from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

/** The trajectory log of a sandbox, and replay from it. */
export function trajectoryRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['trajectory'];
    app.get(
      '/v1/sandboxes/:id/trajectory',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            'Every logged step (commands, sessions, file changes, network switches, pauses) with its result; kept for a while after the sandbox is killed (--trajectory-retention-hours, default 24)',
          params: SandboxIdParams,
          querystring: TrajectoryQuery,
          response: { 200: Trajectory, ...errors },
        },
      },
      async (req) => {
        await control.sandboxes.assertTrajectoryKept(req.caller, req.params.id); // also readable for a while after a kill
        return {
          sandboxId: req.params.id,
          ...(await control.trajectory.list(req.params.id, req.query.afterSeq ?? 0, req.query.limit ?? 1000)),
        };
      },
    );
    app.post(
      '/v1/sandboxes/:id/replay',
      {
        config: access.key,
        schema: {
          tags,
          summary: "Build a new sandbox from this one's image and re-run its logged steps in order (e.g. after its node was lost)",
          params: SandboxIdParams,
          response: { 201: ReplayResult, ...errors },
        },
      },
      async (req, reply) => reply.status(201).send(await control.replays.replay(req.caller, req.params.id)),
    );
  };
}
