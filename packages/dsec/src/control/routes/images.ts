import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Readable, Transform } from 'node:stream';
import {
  BuildImageRequest, ErrorBody, ImageInfo, ImageList, ImportImageQuery, ImportImageResult, MAX_IMAGE_IMPORT_BYTES,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { buildBusyboxImage } from '../../image/builders/busybox.js';
import { buildDebianImage } from '../../image/builders/debian.js';
import { type ImageId, type ImageStore, normalizeName } from '../../image/image-store.js';
import { ImportError, importImageArchive } from '../../image/oci-import.js';
import { collectGarbage } from '../image-gc.js';
import type { StateStore } from '../state-store.js';
import { Type } from 'typebox';
import { errorResponses as errors } from './error-responses.js';

/** Counts bytes through; past `limit` the upload fails with 413 rather than filling a disk. */
function limitBytes(limit: number): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      seen += chunk.length;
      if (seen > limit) cb(new ApiError('PAYLOAD_TOO_LARGE', `the archive is over the ${limit}-byte limit`, { limit }));
      else cb(null, chunk);
    },
  });
}

export interface ImageRouteDeps {
  images: ImageStore;
  store: StateStore;
}

export function imageRoutes(deps: ImageRouteDeps): FastifyPluginAsync {
  const { images, store } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['images'];
    app.get('/v1/images', { schema: { tags, summary: 'List images', response: { 200: ImageList, 401: ErrorBody } } }, async () => ({ images: images.list() }));

    app.post(
      '/v1/images',
      { schema: { tags, summary: 'Build an image (busybox or debian minbase); cached by inputs', body: BuildImageRequest, response: { 201: ImageInfo, 400: ErrorBody, 401: ErrorBody, 500: ErrorBody } } },
      async (req, reply) => {
        const { builder, name, packages } = req.body;
        const log = (m: string): void => req.log.info({ builder }, m);
        let built;
        try {
          built =
            builder === 'busybox'
              ? await buildBusyboxImage(images, { name, progress: log })
              : await buildDebianImage(images, { name, packages, progress: log });
        } catch (err) {
          throw new ApiError('INTERNAL', `image build failed: ${(err as Error).message}`, { builder });
        }
        return reply.status(201).send(images.info(built.id)!);
      },
    );

    const ARCHIVE_TYPES = ['application/x-tar', 'application/gzip', 'application/x-gzip', 'application/zstd'];
    app.addContentTypeParser(ARCHIVE_TYPES, (_req, payload, done) => done(null, payload));

    app.post(
      '/v1/images/import',
      {
        schema: {
          tags,
          summary:
            'Import an OCI image layout or a `docker save` archive (raw body: application/x-tar, or gzip/zstd of one); digests are verified, each layer becomes an EROFS layer',
          querystring: ImportImageQuery,
          response: { 201: ImportImageResult, ...errors },
        },
      },
      async (req, reply) => {
        if (!(req.body instanceof Readable)) {
          throw new ApiError('UNSUPPORTED_MEDIA_TYPE', `send the archive as the raw body with Content-Type: ${ARCHIVE_TYPES.join(' or ')}`);
        }
        const limited = req.body.pipe(limitBytes(MAX_IMAGE_IMPORT_BYTES));
        req.body.on('error', (err) => limited.destroy(err));
        let result;
        try {
          result = await importImageArchive(images, limited, {
            name: req.query.name,
            squash: req.query.squash ?? false,
            ref: req.query.ref,
            progress: (m) => req.log.info({ import: true }, m),
          });
        } catch (err) {
          if (err instanceof ApiError) throw err;
          if (err instanceof ImportError) throw new ApiError('INVALID_REQUEST', `image import failed: ${err.message}`);
          throw new ApiError('INTERNAL', `image import failed: ${(err as Error).message}`);
        }
        const { id, format, sourceRef, squashed, layers, warnings } = result;
        return reply.status(201).send({ image: images.info(id)!, format, ...(sourceRef ? { sourceRef } : {}), squashed, layers, warnings });
      },
    );

    app.delete(
      '/v1/images/:ref',
      {
        schema: {
          tags,
          summary: 'Untag an image name, or delete an image by id (with its names); layers are freed by GC when nothing uses them',
          params: Type.Object({ ref: Type.String({ minLength: 1, maxLength: 200 }) }),
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        const { ref } = req.params;
        const id = images.resolve(ref);
        if (!id) throw new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(ref)}`, { image: ref });
        if (ref.startsWith('sha256:')) images.remove(id as ImageId);
        else images.untag(normalizeName(ref));
        return reply.status(204).send(null);
      },
    );

    app.post(
      '/v1/images/gc',
      {
        schema: {
          tags,
          summary: 'Delete layer blobs no image or live sandbox uses (blobs younger than 10 minutes are kept)',
          response: {
            200: Type.Object({ removedLayers: Type.Array(Type.String()), freedBytes: Type.Integer(), keptLayers: Type.Integer(), removedTemp: Type.Array(Type.String()) }),
            ...errors,
          },
        },
      },
      async () => collectGarbage(images, store),
    );
  };
}
