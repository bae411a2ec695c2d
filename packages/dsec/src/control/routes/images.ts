import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { BuildImageRequest, ErrorBody, ImageInfo, ImageList } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { buildBusyboxImage } from '../../image/builders/busybox.js';
import { buildDebianImage } from '../../image/builders/debian.js';
import type { ImageStore } from '../../image/image-store.js';

export interface ImageRouteDeps {
  images: ImageStore;
}

export function imageRoutes(deps: ImageRouteDeps): FastifyPluginAsync {
  const { images } = deps;
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
  };
}
