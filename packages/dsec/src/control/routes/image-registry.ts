import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ErrorBody, PullImageRequest, PullImageResult, PushImageRequest, PushImageResult } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ImageStore } from '../../image/image-store.js';
import { pullImage } from '../../image/registry/image-pull.js';
import { pushImage } from '../../image/registry/image-push.js';
import { registryClientFor } from '../../image/registry/registry-config.js';
import { ImageTransferError, RegistryAuthError, RegistryError } from '../../image/registry/registry-client.js';
import { parseRegistryRef, RegistryRefError, type RegistryRef } from '../../image/registry/registry-ref.js';
import { errorResponses } from './error-responses.js';
import { access } from '../../http/access.js';

/**
 * `POST /v1/images/push` and `/v1/images/pull`: images between this cluster and an OCI registry,
 * as `dsec image push|pull` does from a shell on the control plane's host. The registry account is
 * the control plane's (DSEC_REGISTRY_USER, DSEC_REGISTRY_PASSWORD[_FILE] in its environment):
 * registry secrets never travel in API bodies.
 */
export function imageRegistryRoutes(deps: { images: ImageStore }): FastifyPluginAsync {
  const { images } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['images'];
    const errors = { ...errorResponses, 403: ErrorBody };

    app.post(
      '/v1/images/push',
      { config: access.key,
        schema: {
          tags,
          summary: "Push an image to an OCI registry as a dsec artifact (its EROFS layers, dsec's media types), with the control plane's registry account",
          body: PushImageRequest,
          response: { 200: PushImageResult, ...errors },
        },
      },
      async (req) => {
        const ref = parseRef(req.body.ref);
        if (ref.digest !== undefined) throw new ApiError('INVALID_REQUEST', `push to a tag, not a digest (${req.body.ref}): the registry names the manifest's digest`, { field: 'ref' });
        if (!(await images.resolve(req.body.image))) throw new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(req.body.image)}`, { image: req.body.image });
        const tag = ref.tag ?? 'latest';
        try {
          const r = await pushImage(images, req.body.image, registryClientFor(ref, { onRetry: (why) => req.log.warn(`registry: retrying: ${why}`) }), tag);
          return { ref: `${ref.host}/${ref.repository}:${tag}`, ...r };
        } catch (err) {
          throw transferError(err, ref);
        }
      },
    );

    app.post(
      '/v1/images/pull',
      { config: access.key,
        schema: {
          tags,
          summary: 'Pull a dsec image from an OCI registry (by tag or @sha256 digest); layers are verified, broken downloads resume with Range requests',
          body: PullImageRequest,
          response: { 201: PullImageResult, ...errors },
        },
      },
      async (req, reply) => {
        const ref = parseRef(req.body.ref);
        try {
          const r = await pullImage(images, registryClientFor(ref, { onRetry: (why) => req.log.warn(`registry: retrying: ${why}`) }), ref, {
            name: req.body.name,
            progress: (line) => req.log.info({ pull: req.body.ref }, line),
          });
          const { digest, fetchedLayers, bytes, resumes } = r;
          return await reply.status(201).send({ image: (await images.info(r.id))!, digest, fetchedLayers, bytes, resumes });
        } catch (err) {
          throw transferError(err, ref);
        }
      },
    );
  };
}

function parseRef(text: string): RegistryRef {
  try {
    return parseRegistryRef(text);
  } catch (err) {
    if (err instanceof RegistryRefError) throw new ApiError('INVALID_REQUEST', err.message, { field: 'ref' });
    throw err;
  }
}

/** A registry's answer as the API's error: refused credentials 403, no such manifest 404, down 503, the rest 400. */
function transferError(err: unknown, ref: RegistryRef): unknown {
  if (!(err instanceof ImageTransferError)) return err;
  const details = { registry: ref.host, repository: ref.repository, ...(err instanceof RegistryError && err.status !== undefined ? { registryStatus: err.status, registryCodes: err.codes } : {}) };
  if (err instanceof RegistryAuthError) return new ApiError('REGISTRY_AUTH_FAILED', err.message, details);
  if (err instanceof RegistryError && err.status === 404) return new ApiError('IMAGE_NOT_FOUND', err.message, details);
  if (err instanceof RegistryError && (err.status === undefined || err.status >= 500)) return new ApiError('REGISTRY_UNAVAILABLE', err.message, details);
  return new ApiError('INVALID_REQUEST', err.message, details);
}
