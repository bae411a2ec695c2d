import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  CreateSandboxRequest, ErrorBody, ExecRequest, ExecResult, FilePathQuery, ListSandboxesQuery, MAX_FILE_BYTES, SandboxIdParams, SandboxInfo,
  SandboxList, WriteFileResult,
} from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import type { Metrics } from './system.js';

const errors = { 400: ErrorBody, 401: ErrorBody, 404: ErrorBody, 409: ErrorBody, 413: ErrorBody, 500: ErrorBody, 503: ErrorBody };

function parseLabels(label: string | string[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of label === undefined ? [] : Array.isArray(label) ? label : [label]) {
    const i = kv.indexOf('=');
    out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

/** Sandbox lifecycle, exec and files: thin handlers over ControlPlane. */
export function sandboxRoutes(deps: { control: ControlPlane; metrics: Metrics }): FastifyPluginAsync {
  const { control, metrics } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['sandboxes'];

    app.post('/v1/sandboxes', { schema: { tags, summary: 'Create a sandbox', body: CreateSandboxRequest, response: { 201: SandboxInfo, ...errors } } }, async (req, reply) => {
      const started = performance.now();
      const info = await control.create(req.body);
      metrics.observeCreate(performance.now() - started);
      return reply.status(201).send(info);
    });

    app.get('/v1/sandboxes', { schema: { tags, summary: 'List sandboxes', querystring: ListSandboxesQuery, response: { 200: SandboxList, ...errors } } }, async (req) => {
      const filter: Parameters<ControlPlane['list']>[0] = { labels: parseLabels(req.query.label) };
      if (req.query.status) filter.status = req.query.status;
      return { sandboxes: control.list(filter) };
    });

    app.get('/v1/sandboxes/:id', { schema: { tags, summary: 'Inspect a sandbox', params: SandboxIdParams, response: { 200: SandboxInfo, ...errors } } }, async (req) =>
      control.get(req.params.id),
    );

    app.delete('/v1/sandboxes/:id', { schema: { tags, summary: 'Kill a sandbox and remove all it had', params: SandboxIdParams, response: { 204: Type.Null(), ...errors } } }, async (req, reply) => {
      await control.kill(req.params.id);
      return reply.status(204).send(null);
    });

    app.post(
      '/v1/sandboxes/:id/exec',
      { schema: { tags, summary: 'Run a command to completion', params: SandboxIdParams, body: ExecRequest, response: { 200: ExecResult, ...errors } } },
      async (req, reply) => {
        // A caller that hangs up does not leave its command running: the command is killed.
        const abort = new AbortController();
        // (The response's close, not the request's: a request closes once its body is read.)
        const onClose = (): void => {
          if (!reply.raw.writableFinished) abort.abort();
        };
        reply.raw.on('close', onClose);
        try {
          const started = performance.now();
          const result = await control.exec(req.params.id, req.body, abort.signal);
          metrics.observeExec(performance.now() - started);
          return result;
        } finally {
          reply.raw.off('close', onClose);
        }
      },
    );

    app.get(
      '/v1/sandboxes/:id/files',
      {
        schema: {
          tags,
          summary: 'Read a file; 200 answers with its raw bytes (application/octet-stream)',
          params: SandboxIdParams,
          querystring: FilePathQuery,
          response: errors,
        },
      },
      async (req, reply) => {
        const data = await control.readFile(req.params.id, req.query.path, MAX_FILE_BYTES);
        return reply.type('application/octet-stream').send(data as never); // raw bytes: no response schema applies
      },
    );

    app.put(
      '/v1/sandboxes/:id/files',
      {
        schema: {
          tags,
          summary: 'Write a file (raw bytes, application/octet-stream); creates parent directories',
          params: SandboxIdParams,
          querystring: FilePathQuery,
          response: { 200: WriteFileResult, ...errors },
        },
      },
      async (req) => {
        const body = req.body;
        if (!Buffer.isBuffer(body)) {
          throw Object.assign(new Error('send the file as the raw body with Content-Type: application/octet-stream'), {
            statusCode: 415,
            code: 'FST_ERR_CTP_INVALID_MEDIA_TYPE',
          });
        }
        const mode = req.query.mode === undefined ? 0o644 : parseInt(req.query.mode, 8);
        const bytes = await control.writeFile(req.params.id, req.query.path, body, mode);
        return { path: req.query.path, bytes };
      },
    );
  };
}
