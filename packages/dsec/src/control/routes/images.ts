import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Readable, Transform } from 'node:stream';
import {
  BuildImageRequest,
  ErrorBody,
  GcResult,
  ImageInfo,
  ImageList,
  ImageRefParams,
  ImportImageQuery,
  ImportImageResult,
  MAX_IMAGE_IMPORT_BYTES,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ImageId, ImageStore } from '../../image/image-store.js';
import { GC_GRACE_MS, collectGarbage } from '../image-gc.js';
import { runImageJob, uploadPath } from '../image-jobs.js';
import type { ImportResult } from '../../image/oci-import.js';
import { randomBytes } from 'node:crypto';
import { createWriteStream, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { StateStore } from '../state-store.js';
import type { ControlPlane } from '../control-plane.js';
import { Type } from 'typebox';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

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
  /** The data dir the image jobs write into (the one `images` reads). */
  dataDir: string;
  /** For each image's lifetime (snapshotOf). */
  control: Pick<ControlPlane, 'snapshotImages' | 'projectImages' | 'registry'>;
}

export function imageRoutes(deps: ImageRouteDeps): FastifyPluginAsync {
  const { images, store, dataDir } = deps;
  /** An image as the API shows it: with the sandbox it goes away with, if it is an ephemeral snapshot. */
  const withLifetime = async (info: ImageInfo): Promise<ImageInfo> => {
    const owner = await deps.control.snapshotImages.ownerOf(info.id);
    return owner && info.names.length === 0 ? { ...info, snapshotOf: owner } : info;
  };
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['images'];
    // A project key sees shared images and its project's own; an admin key sees every image.
    const scope = (req: { caller: { admin: boolean; project: string } }): string | undefined =>
      req.caller.admin ? undefined : req.caller.project;
    app.get(
      '/v1/images',
      {
        config: access.key,
        schema: {
          tags,
          summary: "List images (a project key: shared ones and its project's own)",
          response: { 200: ImageList, 401: ErrorBody },
        },
      },
      async (req) => ({
        images: await Promise.all((await deps.control.projectImages.list(scope(req))).map(withLifetime)),
      }),
    );

    app.get(
      '/v1/images/:ref',
      {
        config: access.key,
        schema: { tags, summary: 'One image by name or id', params: ImageRefParams, response: { 200: ImageInfo, ...errors } },
      },
      async (req) => {
        const id = await deps.control.projectImages.resolve(scope(req), req.params.ref);
        const info = id && (await deps.control.projectImages.info(scope(req), id));
        if (!info)
          throw new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(req.params.ref)}; list images with \`dsec image ls\``, {
            image: req.params.ref,
          });
        return await withLifetime(info);
      },
    );

    app.post(
      '/v1/images',
      {
        config: access.admin('building a shared image'),
        schema: {
          tags,
          summary: 'Build an image (busybox or debian minbase); cached by inputs',
          body: BuildImageRequest,
          response: { 201: ImageInfo, 400: ErrorBody, 401: ErrorBody, 500: ErrorBody },
        },
      },
      async (req, reply) => {
        const { builder, name, packages } = req.body;
        const args = ['build', builder, ...(name ? ['--name', name] : []), ...(packages ?? []).flatMap((p) => ['-p', p])];
        const out = await runImageJob(dataDir, args, {
          log: (m) => req.log.info({ builder }, m),
          userError: /invalid image name|unknown builder|-p\/--package/,
          layerDir: dirname(images.layers.dir),
        });
        await images.refresh(); // the job wrote files: into the store with them, for every replica
        // The job prints "<name> <id>"; the image is in the store it wrote to.
        const id = /(sha256:[0-9a-f]{64})\s*$/.exec(out.trim())?.[1];
        const info = id && images.info(id as ImageId);
        if (!info) throw new ApiError('INTERNAL', `image build finished without an image: ${out.slice(0, 300)}`, { builder });
        return reply.status(201).send(info);
      },
    );

    const ARCHIVE_TYPES = ['application/x-tar', 'application/gzip', 'application/x-gzip', 'application/zstd'];
    app.addContentTypeParser(ARCHIVE_TYPES, (_req, payload, done) => done(null, payload));

    app.post(
      '/v1/images/import',
      {
        config: access.admin('importing a shared image'),
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
        // The archive is stored first (within the size limit), then imported by a job.
        const file = uploadPath(dataDir, randomBytes(6).toString('hex'));
        try {
          await pipeline(req.body, limitBytes(MAX_IMAGE_IMPORT_BYTES), createWriteStream(file, { mode: 0o600 }));
          const q = req.query;
          const args = [
            'import',
            file,
            '--json',
            ...(q.name ? ['--name', q.name] : []),
            ...(q.squash ? ['--squash'] : []),
            ...(q.ref ? ['--ref', q.ref] : []),
          ];
          const out = await runImageJob(dataDir, args, {
            log: (m) => req.log.info({ import: true }, m),
            userError: /image import failed|invalid image name/,
            layerDir: dirname(images.layers.dir),
          });
          await images.refresh(); // the job wrote files: into the store with them, for every replica
          const r = JSON.parse(out) as ImportResult;
          const { id, format, sourceRef, squashed, layers, warnings } = r;
          return await reply
            .status(201)
            .send({ image: images.info(id)!, format, ...(sourceRef ? { sourceRef } : {}), squashed, layers, warnings });
        } finally {
          rmSync(file, { force: true });
        }
      },
    );

    app.delete(
      '/v1/images/:ref',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Untag an image name, or delete an image by id (with its names); layers are freed by GC when nothing uses them',
          params: ImageRefParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await deps.control.projectImages.remove(req.caller, req.params.ref);
        return reply.status(204).send(null);
      },
    );

    app.post(
      '/v1/images/gc',
      {
        config: access.admin('collecting layer garbage'),
        schema: {
          tags,
          summary: `Delete layer blobs no image or live sandbox uses (blobs younger than ${GC_GRACE_MS / 60_000} minutes are kept: a build or snapshot may not have registered its image yet)`,
          response: { 200: GcResult, ...errors },
        },
      },
      async () => {
        return collectGarbage(images, store, Date.now(), GC_GRACE_MS, deps.control.registry);
      },
    );
  };
}
