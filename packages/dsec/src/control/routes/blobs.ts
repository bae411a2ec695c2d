import { Readable } from 'node:stream';
import { createReadStream, statSync } from 'node:fs';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import parseRange from 'range-parser';
import { Type } from 'typebox';
import { ErrorBody } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { isLayerDigest, type LayerDigest, type LayerStore } from '../../image/layer-store.js';
import type { ClusterRegistry } from '../cluster/cluster-registry.js';
import { access } from '../../http/access.js';

/** Content type of an uploaded layer blob (an EROFS image). */
export const LAYER_MEDIA_TYPE = 'application/vnd.dsec.layer.erofs';

/** Raw bytes; serialization is skipped for streams, this only documents the response. */
const BlobBytes = Type.Unsafe<NodeJS.ReadableStream>({ type: 'string', format: 'binary' });

const ChunkIndexBody = Type.Object({
  chunkSize: Type.Integer({
    description: 'Bytes per chunk (256 KiB unless the store was configured otherwise; a layer keeps the size it was recorded with).',
  }),
  size: Type.Integer({ description: 'Bytes in the blob.' }),
  digests: Type.Array(Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }), { description: 'sha256 of each chunk, in order.' }),
  prefetch: Type.Array(Type.Integer({ minimum: 0 }), {
    description: 'Chunks to fetch first, in order (empty until a first run recorded them).',
  }),
});

const PrefetchBody = Type.Object(
  {
    chunks: Type.Array(Type.Integer({ minimum: 0 }), {
      maxItems: 1_000_000,
      description: 'Chunk numbers in the order they were first read.',
    }),
  },
  { additionalProperties: false },
);

const DigestParams = Type.Object({ digest: Type.String({ pattern: '^sha256:[0-9a-f]{64}$', description: 'sha256:<64 hex>' }) });

/**
 * The control plane's blob endpoint: layer blobs by digest, for edges on other nodes (no shared
 * filesystem) and for lazy loading (single byte ranges, RFC 9110). Edges authenticate with the
 * cluster token, users with an API key. Uploads (a snapshot's new layer, made on an edge) are
 * checked against their digest before they enter the store. With a cluster registry as the blob
 * store, a blob this replica lacks is fetched from it first, and an upload is put there too.
 */
export function blobRoutes(deps: { layers: LayerStore; registry?: ClusterRegistry }): FastifyPluginAsync {
  const { layers } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['blobs'];
    // Layers are hundreds of MB: the body stays a stream, hashed as it is written to disk.
    app.addContentTypeParser(LAYER_MEDIA_TYPE, (_req, payload, done) => done(null, payload));
    const sizeOf = async (digest: LayerDigest): Promise<number> => {
      await layers.fetch(digest);
      try {
        return statSync(layers.path(digest)).size;
      } catch {
        throw new ApiError('BLOB_NOT_FOUND', `no blob ${digest} in the layer store`, { digest });
      }
    };

    app.head(
      '/v1/blobs/:digest',
      { config: access.clusterOrAdmin, schema: { tags, summary: 'Size of a layer blob', params: DigestParams } },
      async (req, reply) => {
        const size = await sizeOf(req.params.digest as LayerDigest);
        return reply
          .header('content-length', size)
          .header('accept-ranges', 'bytes')
          .header('content-type', 'application/octet-stream')
          .send();
      },
    );

    app.get(
      '/v1/blobs/:digest',
      {
        config: access.clusterOrAdmin,
        schema: {
          tags,
          summary: 'A layer blob by digest; a single Range gives 206 with Content-Range',
          params: DigestParams,
          response: { 200: BlobBytes, 206: BlobBytes, 401: ErrorBody, 404: ErrorBody, 416: ErrorBody },
        },
      },
      async (req, reply) => {
        const digest = req.params.digest as LayerDigest;
        const size = await sizeOf(digest);
        void reply.header('accept-ranges', 'bytes').header('content-type', 'application/octet-stream');
        const range = req.headers.range;
        if (range === undefined) return reply.header('content-length', size).send(createReadStream(layers.path(digest)));
        const ranges = parseRange(size, range, { combine: true });
        if (ranges === -1 || ranges === -2 || ranges.type !== 'bytes' || ranges.length !== 1) {
          void reply.header('content-range', `bytes */${size}`);
          throw new ApiError(
            'RANGE_NOT_SATISFIABLE',
            `range ${JSON.stringify(range)} is not one satisfiable byte range of a ${size}-byte blob`,
            { size },
          );
        }
        const { start, end } = ranges[0]!;
        return reply
          .status(206)
          .header('content-range', `bytes ${start}-${end}/${size}`)
          .header('content-length', end - start + 1)
          .send(createReadStream(layers.path(digest), { start, end }));
      },
    );

    app.get(
      '/v1/blobs/:digest/chunks',
      {
        config: access.clusterOrAdmin,
        schema: {
          tags,
          summary: "A layer blob's per-chunk sha256 list and prefetch list (for lazy loading)",
          description:
            'Chunk i covers bytes [i*chunkSize, min(size, (i+1)*chunkSize)). A lazy node checks each chunk it fetches against its digest here, so it trusts a chunk before the whole blob has arrived. Recorded when the layer is made; computed (and kept) on first request for a layer made before.',
          params: DigestParams,
          response: { 200: ChunkIndexBody, 401: ErrorBody, 404: ErrorBody },
        },
      },
      async (req) => {
        const digest = req.params.digest as LayerDigest;
        await sizeOf(digest);
        return { ...(await layers.chunkIndex(digest)), prefetch: layers.prefetchList(digest) };
      },
    );

    app.put(
      '/v1/blobs/:digest/prefetch',
      {
        config: access.clusterOrAdmin,
        schema: {
          tags,
          summary: "Record a layer's prefetch list (the chunks a first run read, in order); the first one recorded is kept",
          params: DigestParams,
          body: PrefetchBody,
          response: {
            200: Type.Object({ recorded: Type.Boolean({ description: 'False when a list was recorded before (it is kept).' }) }),
            400: ErrorBody,
            401: ErrorBody,
            404: ErrorBody,
          },
        },
      },
      async (req) => {
        const digest = req.params.digest as LayerDigest;
        const size = await sizeOf(digest);
        const { chunkSize } = await layers.chunkIndex(digest);
        const count = Math.ceil(size / chunkSize);
        const bad = req.body.chunks.find((i) => i >= count);
        if (bad !== undefined)
          throw new ApiError('INVALID_REQUEST', `chunk ${bad} is past the blob's last chunk (${count - 1})`, {
            field: 'chunks',
            chunks: count,
          });
        return { recorded: layers.recordPrefetchList(digest, [...new Set(req.body.chunks)]) };
      },
    );

    app.put(
      '/v1/blobs/:digest',
      {
        config: access.clusterOrAdmin,
        schema: {
          tags,
          summary: 'Upload a layer blob (raw bytes); refused unless its sha256 is the digest',
          params: DigestParams,
          response: { 201: Type.Object({ digest: Type.String(), size: Type.Integer() }), 400: ErrorBody, 401: ErrorBody },
        },
      },
      async (req, reply) => {
        const digest = req.params.digest as LayerDigest;
        if (!isLayerDigest(digest)) throw new ApiError('INVALID_REQUEST', 'digest must be sha256:<64 hex>', { field: 'digest' });
        // Any other content type was parsed by its own parser (JSON into an object): the layer's bytes are not here.
        if (!(req.body instanceof Readable))
          throw new ApiError('INVALID_REQUEST', `send the layer's bytes with Content-Type: ${LAYER_MEDIA_TYPE}`, { field: 'content-type' });
        if (!layers.has(digest)) {
          const got = await layers.addStream(req.body as NodeJS.ReadableStream);
          if (got !== digest)
            throw new ApiError('INVALID_REQUEST', `the uploaded bytes hash to ${got}, not ${digest}`, { expected: digest, got });
        } else {
          (req.body as NodeJS.ReadableStream).resume();
        }
        // Every replica reads it from the registry (the snapshot that made it may be recorded at another).
        await deps.registry?.ensure([digest]);
        return reply.status(201).send({ digest, size: layers.size(digest) });
      },
    );
  };
}
