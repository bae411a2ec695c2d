import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DirListing, FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { access } from '../../http/access.js';
import type { EdgeApi } from '../protocol/edge-api.js';
import { EDGE_PREFIX } from '../protocol/schemas.js';
import { ACTOR_QUERY_PATTERN, actorFromQuery, type FileActor, type FileMetadataWrite } from '../protocol/file-options.js';
import { errors, Id, OCTETS, PathQ } from './edge-route-schemas.js';

/** Who a file call acts as (edge/protocol/file-options.ts): in a query `uid:gid:groups`, in a body an object. */
const AsQ = Type.Optional(Type.String({ pattern: ACTOR_QUERY_PATTERN, description: "uid:gid:g1,g2 (the sandbox's ids)" }));
const Id32 = Type.Integer({ minimum: 0, maximum: 2 ** 32 - 2 });
const AsBody = Type.Optional(
  Type.Object({ uid: Id32, gid: Id32, groups: Type.Array(Id32, { maxItems: 65536 }) }, { additionalProperties: false }),
);
const MetadataPrefixQ = Type.Optional(Type.String({ minLength: 1, maxLength: 255 }));
const StatQ = Type.Object({ path: PathQ.properties.path, as: AsQ, metadataPrefix: MetadataPrefixQ }, { additionalProperties: false });
/** The call's options from its query, without keys for what is absent. */
function fileQueryOptions(q: { as?: string | undefined; metadataPrefix?: string | undefined }): {
  as?: FileActor;
  metadataPrefix?: string;
} {
  return {
    ...(q.as !== undefined ? { as: actorFromQuery(q.as) } : {}),
    ...(q.metadataPrefix !== undefined ? { metadataPrefix: q.metadataPrefix } : {}),
  };
}
function bodyAs(b: { as?: FileActor | undefined }): { as?: FileActor } {
  return b.as ? { as: b.as } : {};
}
/** `metadata` of a write, as JSON in its query (the body is the file's bytes). */
function metadataFromQuery(q: string | undefined): FileMetadataWrite | undefined {
  if (q === undefined) return undefined;
  try {
    return JSON.parse(q) as FileMetadataWrite;
  } catch {
    throw new ApiError('INVALID_REQUEST', 'metadata: not JSON ({"prefix": "user.…", "values": {…}})', { field: 'metadata' });
  }
}

/**
 * A sandbox's files on the edge protocol: a file's bytes raw both ways (its options in the query),
 * stat, list, mkdir, remove and rename as JSON, a tree as a tar stream both ways.
 */
export function fileRoutes(edge: EdgeApi): FastifyPluginAsync {
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const S = `${EDGE_PREFIX}/sandboxes/:id`;
    app.get(
      `${S}/files`,
      {
        config: access.cluster,
        schema: {
          params: Id,
          querystring: Type.Object({ path: PathQ.properties.path, maxBytes: Type.Integer({ minimum: 0 }), as: AsQ }),
          response: errors,
        },
      },
      async (req, reply) =>
        reply
          .type(OCTETS)
          .send((await edge.readFile(req.params.id, req.query.path, req.query.maxBytes, fileQueryOptions(req.query))) as never),
    );
    app.put(
      `${S}/files`,
      {
        config: access.cluster,
        schema: {
          params: Id,
          querystring: Type.Object({
            path: PathQ.properties.path,
            mode: Type.Integer({ minimum: 0, maximum: 0o7777 }),
            as: AsQ,
            metadata: Type.Optional(Type.String({ description: 'JSON: {"prefix": "user.…", "values": {name: value}}' })),
          }),
          response: { 200: Type.Object({ bytes: Type.Integer() }), ...errors },
        },
      },
      async (req) => {
        if (!Buffer.isBuffer(req.body)) throw new ApiError('UNSUPPORTED_MEDIA_TYPE', `send the file as ${OCTETS}`);
        const metadata = metadataFromQuery(req.query.metadata);
        const opts = { ...fileQueryOptions(req.query), ...(metadata ? { metadata } : {}) };
        return { bytes: await edge.writeFile(req.params.id, req.query.path, req.body, req.query.mode, opts) };
      },
    );
    app.get(
      `${S}/files/stat`,
      { config: access.cluster, schema: { params: Id, querystring: StatQ, response: { 200: FileStat, ...errors } } },
      async (req) => edge.statPath(req.params.id, req.query.path, fileQueryOptions(req.query)),
    );
    app.get(
      `${S}/files/list`,
      { config: access.cluster, schema: { params: Id, querystring: StatQ, response: { 200: DirListing, ...errors } } },
      async (req) => ({ path: req.query.path, ...(await edge.listDir(req.params.id, req.query.path, fileQueryOptions(req.query))) }),
    );
    app.post(
      `${S}/files/mkdir`,
      {
        config: access.cluster,
        schema: {
          params: Id,
          body: Type.Object({ path: PathQ.properties.path, parents: Type.Boolean(), as: AsBody }),
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await edge.makeDir(req.params.id, req.body.path, req.body.parents, bodyAs(req.body));
        return reply.status(204).send(null);
      },
    );
    app.post(
      `${S}/files/remove`,
      {
        config: access.cluster,
        schema: {
          params: Id,
          body: Type.Object({ path: PathQ.properties.path, recursive: Type.Boolean(), as: AsBody }),
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await edge.removePath(req.params.id, req.body.path, req.body.recursive, bodyAs(req.body));
        return reply.status(204).send(null);
      },
    );
    app.post(
      `${S}/files/rename`,
      {
        config: access.cluster,
        schema: {
          params: Id,
          body: Type.Object({ from: PathQ.properties.path, to: PathQ.properties.path, as: AsBody }),
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await edge.renamePath(req.params.id, req.body.from, req.body.to, bodyAs(req.body));
        return reply.status(204).send(null);
      },
    );
    app.get(
      `${S}/files/tar`,
      { config: access.cluster, schema: { params: Id, querystring: PathQ, response: errors } },
      async (req, reply) =>
        reply.type('application/x-tar').send(Readable.from(await edge.downloadTar(req.params.id, req.query.path)) as never),
    );
    app.put(
      `${S}/files/tar`,
      {
        config: access.cluster,
        schema: { params: Id, querystring: PathQ, response: { 200: Type.Object({ bytes: Type.Integer() }), ...errors } },
      },
      async (req) => {
        if (!(req.body instanceof Readable)) throw new ApiError('UNSUPPORTED_MEDIA_TYPE', 'send the archive as application/x-tar');
        return { bytes: await edge.uploadTar(req.params.id, req.query.path, req.body) };
      },
    );
  };
}
