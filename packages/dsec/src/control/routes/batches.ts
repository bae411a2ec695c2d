import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { BatchEventsQuery, BatchIdParams, BatchInfo, BatchList, CreateBatchRequest, ListBatchesQuery } from '@dsec/sdk/schema';
import type { BatchService } from '../service/batches.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';
import { errorResponses as errors } from './error-responses.js';
import { NDJSON } from './exec.js';
import { listScope } from './access.js';
import { access } from '../../http/access.js';

/**
 * Batches: POST accepts up to 32,000 sandboxes of one spec at once (202) and, with
 * `Accept: application/x-ndjson`, streams the progress right away; GET …/events resumes a
 * progress stream after the last sequence number a client saw; DELETE cancels.
 */
export function batchRoutes(deps: { batches: BatchService }): FastifyPluginAsync {
  const { batches } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['batches'];

    const stream = (id: string, after: number, follow: boolean, reply: Parameters<typeof abortOnHangup>[0]): Readable => {
      const hangup = abortOnHangup(reply);
      const lines = async function* (): AsyncGenerator<string> {
        try {
          // A run of events in one write: one line per event, one socket write per run.
          yield* batches.eventText(id, after, follow, hangup.signal);
        } finally {
          hangup.done();
        }
      };
      return Readable.from(lines());
    };

    app.post(
      '/v1/batches',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Create up to 32,000 sandboxes of one spec; 202 with the batch, or with Accept: ${NDJSON} its progress as a stream`,
          body: CreateBatchRequest,
          response: { 202: BatchInfo, ...errors },
        },
      },
      async (req, reply) => {
        const info = await batches.create(req.body, req.caller.project);
        if ((req.headers.accept ?? '').includes(NDJSON))
          return reply
            .status(202)
            .type(NDJSON)
            .send(stream(info.id, -1, true, reply) as never);
        return reply.status(202).send(info);
      },
    );
    app.get(
      '/v1/batches',
      {
        config: access.key,
        schema: {
          tags,
          summary: "Batches, newest first, with their counts: the caller's project's (an admin key: every project's)",
          querystring: ListBatchesQuery,
          response: { 200: BatchList, ...errors },
        },
      },
      async (req) => ({
        batches: await batches.list(req.query.limit ?? 50, listScope(req.caller)),
      }),
    );
    app.get(
      '/v1/batches/:id',
      {
        config: access.key,
        schema: { tags, summary: 'A batch: state and counts', params: BatchIdParams, response: { 200: BatchInfo, ...errors } },
      },
      async (req) => batches.info(req.params.id),
    );
    app.get(
      '/v1/batches/:id/events',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Progress as NDJSON (${NDJSON}): events with seq > after, then live ones until the batch ends (follow=false: only what exists)`,
          params: BatchIdParams,
          querystring: BatchEventsQuery,
          response: errors,
        },
      },
      async (req, reply) => {
        await batches.info(req.params.id); // 404 before the stream starts
        return reply.type(NDJSON).send(stream(req.params.id, req.query.after ?? -1, req.query.follow ?? true, reply) as never);
      },
    );
    app.delete(
      '/v1/batches/:id',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Cancel a batch: stop creating, kill what it made',
          params: BatchIdParams,
          response: { 200: BatchInfo, ...errors },
        },
      },
      async (req) => batches.cancel(req.params.id),
    );
  };
}
