import { releaseWhenSent } from '../../http/release-when-sent.js';
import { Readable, Transform } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  DirListing,
  FilePathQuery,
  FileStat,
  MAX_FILE_BYTES,
  MAX_TAR_UPLOAD_BYTES,
  MkdirRequest,
  PathQuery,
  RemoveQuery,
  RenameRequest,
  SandboxIdParams,
  WriteFileResult,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ControlPlane } from '../control-plane.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

export const TAR = 'application/x-tar';

function requireBuffer(body: unknown): Buffer {
  if (!Buffer.isBuffer(body)) {
    throw new ApiError('UNSUPPORTED_MEDIA_TYPE', 'send the file as the raw body with Content-Type: application/octet-stream');
  }
  return body;
}

/** Counts bytes through; past `limit` the upload fails with 413 rather than filling a disk. */
function limitBytes(limit: number): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      seen += chunk.length;
      if (seen > limit) cb(new ApiError('PAYLOAD_TOO_LARGE', `tar upload is over the ${limit}-byte limit`, { limit }));
      else cb(null, chunk);
    },
  });
}

/** Files: paths resolve inside the sandbox's root; directories travel as tar streams. */
export function fileRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['files'];
    app.addContentTypeParser(TAR, (_req, payload, done) => done(null, payload));

    app.get(
      '/v1/sandboxes/:id/files',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Read a file; 200 answers with its raw bytes (application/octet-stream)',
          params: SandboxIdParams,
          querystring: FilePathQuery,
          response: errors,
        },
      },
      async (req, reply) => {
        const data = await control.files.readFile(req.caller, req.params.id, req.query.path, MAX_FILE_BYTES, {
          hold: (release) => releaseWhenSent(reply, release),
        });
        return reply.type('application/octet-stream').send(data as never); // raw bytes: no response schema applies
      },
    );

    app.put(
      '/v1/sandboxes/:id/files',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Write a file (raw bytes, application/octet-stream); creates parent directories',
          params: SandboxIdParams,
          querystring: FilePathQuery,
          response: { 200: WriteFileResult, ...errors },
        },
      },
      async (req) => {
        const mode = req.query.mode === undefined ? 0o644 : parseInt(req.query.mode, 8);
        const bytes = await control.files.writeFile(req.caller, req.params.id, req.query.path, requireBuffer(req.body), mode);
        return { path: req.query.path, bytes };
      },
    );

    app.delete(
      '/v1/sandboxes/:id/files',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Remove a file, symlink or empty directory (recursive=true: a whole tree)',
          params: SandboxIdParams,
          querystring: RemoveQuery,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await control.files.removePath(req.caller, req.params.id, req.query.path, req.query.recursive ?? false);
        return reply.status(204).send(null);
      },
    );

    app.get(
      '/v1/sandboxes/:id/files/stat',
      {
        config: access.key,
        schema: { tags, summary: 'lstat a path', params: SandboxIdParams, querystring: PathQuery, response: { 200: FileStat, ...errors } },
      },
      async (req) => control.files.stat(req.caller, req.params.id, req.query.path),
    );

    app.get(
      '/v1/sandboxes/:id/files/list',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'List a directory',
          params: SandboxIdParams,
          querystring: PathQuery,
          response: { 200: DirListing, ...errors },
        },
      },
      async (req) => ({
        path: req.query.path,
        ...(await control.files.listDir(req.caller, req.params.id, req.query.path)),
      }),
    );

    app.post(
      '/v1/sandboxes/:id/files/mkdir',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Make a directory',
          params: SandboxIdParams,
          body: MkdirRequest,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await control.files.makeDir(req.caller, req.params.id, req.body.path, req.body.parents ?? true);
        return reply.status(204).send(null);
      },
    );

    app.post(
      '/v1/sandboxes/:id/files/rename',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Rename or move a path',
          params: SandboxIdParams,
          body: RenameRequest,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await control.files.renamePath(req.caller, req.params.id, req.body.from, req.body.to);
        return reply.status(204).send(null);
      },
    );

    app.get(
      '/v1/sandboxes/:id/files/tar',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Download a file or directory as a tar stream (${TAR}), packed inside the sandbox`,
          params: SandboxIdParams,
          querystring: PathQuery,
          response: errors,
        },
      },
      async (req, reply) => {
        const chunks = await control.files.downloadTar(req.caller, req.params.id, req.query.path);
        return reply.type(TAR).send(Readable.from(chunks) as never);
      },
    );

    app.put(
      '/v1/sandboxes/:id/files/tar',
      {
        config: access.key,
        schema: {
          tags,
          summary: `Upload a tar stream (${TAR}) and unpack it into path (created if missing), inside the sandbox`,
          params: SandboxIdParams,
          querystring: PathQuery,
          response: { 200: Type.Object({ path: Type.String(), bytes: Type.Integer() }), ...errors },
        },
      },
      async (req) => {
        if (!(req.body instanceof Readable))
          throw new ApiError('UNSUPPORTED_MEDIA_TYPE', `send the archive as the raw body with Content-Type: ${TAR}`);
        const limited = req.body.pipe(limitBytes(MAX_TAR_UPLOAD_BYTES));
        req.body.on('error', (err) => limited.destroy(err));
        const bytes = await control.files.uploadTar(req.caller, req.params.id, req.query.path, limited);
        return { path: req.query.path, bytes };
      },
    );
  };
}
