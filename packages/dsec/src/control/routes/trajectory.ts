import { releaseWhenSent } from '../../http/release-when-sent.js';
import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ReplayResult, SandboxIdParams, TrajectoriesQuery, Trajectory, TrajectoryQuery } from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import { errorResponses as errors } from './error-responses.js';
import { NDJSON } from './exec.js';
import { parseLabels } from './labels.js';
import { access } from '../../http/access.js';

/** The trajectory log of a sandbox (with its fork lineage), many sandboxes' at once, and replay from it. */
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
            "Every logged step (commands, sessions, file changes, network switches, pauses) with its result; kept for a while after the sandbox is killed (--trajectory-retention-hours, default 24); lineage=true: a fork's ancestors' steps first",
          params: SandboxIdParams,
          querystring: TrajectoryQuery,
          response: { 200: Trajectory, ...errors },
        },
      },
      // also readable for a while after a kill
      async (req, reply) => control.trajectories.read(req.caller, req.params.id, req.query, (release) => releaseWhenSent(reply, release)),
    );
    app.get(
      '/v1/trajectories',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Many sandboxes' steps at once, by label and/or batch (at least one), as ${NDJSON}: one line {sandboxId, seq, at, kind, request, result, …} per step, sandboxes in id order, each one's steps by seq; killed sandboxes whose trajectory is still kept included`,
          description:
            "The caller's project's sandboxes (an admin key: every project's, or `project`'s). Read from the store a page at a time, so a 32,000-sandbox batch streams in constant memory.",
          querystring: TrajectoriesQuery,
          response: errors,
        },
      },
      async (req, reply) => {
        // 400 or 404 before the stream starts.
        const lines = await control.trajectories.stream(req.caller, {
          labels: parseLabels(req.query.label),
          ...(req.query.batch !== undefined ? { batch: req.query.batch } : {}),
          ...(req.query.project !== undefined ? { project: req.query.project } : {}),
        });
        const ndjson = async function* (): AsyncGenerator<string> {
          for await (const line of lines) yield `${JSON.stringify(line)}\n`;
        };
        return reply.type(NDJSON).send(Readable.from(ndjson()) as never);
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
