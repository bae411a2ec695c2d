import { releaseWhenSent } from '../../http/release-when-sent.js';
import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { FnBatchRequest, FnRunRequest, FnRunResult } from '@dsec/sdk/schema';
import type { FnService } from '../service/fn.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';
import { errorResponses as errors } from './error-responses.js';
import { NDJSON } from './exec.js';
import { access } from '../../http/access.js';

/** Function calls: one (JSON) or a batch (NDJSON lines as calls finish); thin handlers over FnService. */
export function fnRoutes(deps: { fn: FnService }): FastifyPluginAsync {
  const { fn } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['fn'];

    app.post(
      '/v1/fn/run',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            'Run a short stateless program (python, node, bash) in a warm worker: fresh process and scratch dir, nothing kept, no network unless asked',
          body: FnRunRequest,
          response: { 200: FnRunResult, ...errors },
        },
      },
      async (req, reply) => {
        const hangup = abortOnHangup(reply);
        try {
          return await fn.run(req.body, {
            project: req.caller?.project,
            signal: hangup.signal,
            hold: (release) => releaseWhenSent(reply, release),
          });
        } finally {
          hangup.done();
        }
      },
    );

    app.post(
      '/v1/fn/batch',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Run up to 10,000 calls, \`concurrency\` at a time; the answer is ${NDJSON}, one line {index, result | error} per call as it finishes`,
          body: FnBatchRequest,
          response: errors,
        },
      },
      async (req, reply) => {
        const hangup = abortOnHangup(reply);
        const lines = fn.batch(req.body, { project: req.caller?.project, signal: hangup.signal });
        // The first line is awaited here: a batch whose calls fail the checks answers 4xx, not a stream.
        const first = await lines.next();
        const body = async function* (): AsyncGenerator<string> {
          try {
            if (!first.done) yield `${JSON.stringify(first.value)}\n`;
            for await (const line of lines) yield `${JSON.stringify(line)}\n`;
          } finally {
            hangup.done();
          }
        };
        // One line read ahead, not Readable.from's 16: a line past a reader that stopped is memory
        // the batch's output reservations no longer hold.
        return reply.type(NDJSON).send(Readable.from(body(), { objectMode: true, highWaterMark: 1 }) as never);
      },
    );
  };
}
