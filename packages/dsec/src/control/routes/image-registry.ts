import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ErrorBody, PullImageRequest, PullImageResult, PushImageRequest, PushImageResult } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ImageStore } from '../../image/image-store.js';
import { defaultPullName, pullImage } from '../../image/registry/image-pull.js';
import { pushImage } from '../../image/registry/image-push.js';
import { registryClientFor, sameOrigin } from '../../image/registry/registry-config.js';
import { ImageTransferError, RegistryAuthError, RegistryError } from '../../image/registry/registry-client.js';
import { parseRegistryRef, RegistryRefError, type RegistryRef } from '../../image/registry/registry-ref.js';
import { errorResponses } from './error-responses.js';
import { access } from '../../http/access.js';
import type { ProjectImages } from '../project-images.js';

/**
 * `POST /v1/images/push` and `/v1/images/pull`: images between this cluster and an OCI registry,
 * as `dsec image push|pull` does from a shell on the control plane's host. Tenancy
 * (docs/PROJECTS.md): a push sends only an image the caller may use; a pulled image is the
 * caller's project's (an admin key's pull is shared), and a pull never moves a name that is not
 * the caller's to move. A project key names only the cluster's registry and those of
 * DSEC_REGISTRY_ALLOW; an admin key any. The registry account is the control plane's
 * (DSEC_REGISTRY_USER, DSEC_REGISTRY_PASSWORD[_FILE] in its environment) and goes only to the
 * cluster's registry (DSEC_REGISTRY): registry secrets never travel in API bodies, nor to a host a
 * caller names.
 */
export interface ImageRegistryRouteDeps {
  images: ImageStore;
  projectImages: ProjectImages;
  /** The cluster's registry (DSEC_REGISTRY): always allowed, and the only one sent the credentials. */
  clusterRegistry?: Pick<RegistryRef, 'baseUrl' | 'host'> | undefined;
  /** DSEC_REGISTRY_ALLOW: further registry hosts a project key may name. */
  registryAllow?: readonly string[];
}

export function imageRegistryRoutes(deps: ImageRegistryRouteDeps): FastifyPluginAsync {
  const { images, projectImages } = deps;
  const allow = new Set((deps.registryAllow ?? []).map((h) => h.toLowerCase()));
  const clusterHost = deps.clusterRegistry?.host.toLowerCase();
  /** A project key may name the cluster's registry and the allowed ones; an admin key any. */
  const checkRegistry = (caller: { admin: boolean }, ref: RegistryRef): void => {
    const host = ref.host.toLowerCase();
    if (caller.admin || host === clusterHost || allow.has(host)) return;
    throw new ApiError(
      'FORBIDDEN',
      `registry ${ref.host} is not allowed for project keys: the operator lists the registries they may use with --registry-allow (env DSEC_REGISTRY_ALLOW)${clusterHost ? `; the cluster's registry ${deps.clusterRegistry!.host} is always allowed` : ''}`,
      { registry: ref.host },
    );
  };
  /** Why a registry other than the cluster's got no credentials, for its auth errors. */
  const accountNote = (ref: RegistryRef): string | undefined =>
    deps.clusterRegistry && sameOrigin(ref.baseUrl, deps.clusterRegistry.baseUrl)
      ? undefined
      : `the control plane's registry account (DSEC_REGISTRY_USER) is sent only to the cluster's registry (DSEC_REGISTRY${deps.clusterRegistry ? `, ${deps.clusterRegistry.baseUrl}` : ', not set'}), not to ${ref.baseUrl}`;
  const clientFor = (ref: RegistryRef, log: { warn: (m: string) => void }) =>
    registryClientFor(ref, {
      credentialsFor: deps.clusterRegistry?.baseUrl ?? null,
      onRetry: (why) => log.warn(`registry: retrying: ${why}`),
    });
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['images'];
    const errors = { ...errorResponses, 403: ErrorBody };

    app.post(
      '/v1/images/push',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            "Push an image the caller may use to an OCI registry (a project key: the cluster's registry or one of DSEC_REGISTRY_ALLOW) as a dsec artifact (its EROFS layers, dsec's media types)",
          body: PushImageRequest,
          response: { 200: PushImageResult, ...errors },
        },
      },
      async (req) => {
        const caller = req.caller;
        const ref = parseRef(req.body.ref);
        if (ref.digest !== undefined)
          throw new ApiError('INVALID_REQUEST', `push to a tag, not a digest (${req.body.ref}): the registry names the manifest's digest`, {
            field: 'ref',
          });
        checkRegistry(caller, ref);
        // Resolved as the caller: another project's private image is as unknown as a missing one.
        const id = await projectImages.resolve(caller.admin ? undefined : caller.project, req.body.image);
        if (!id) throw new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(req.body.image)}`, { image: req.body.image });
        const tag = ref.tag ?? 'latest';
        try {
          const r = await pushImage(images, id, clientFor(ref, req.log), tag);
          return { ref: `${ref.host}/${ref.repository}:${tag}`, ...r };
        } catch (err) {
          throw transferError(err, ref, accountNote(ref));
        }
      },
    );

    app.post(
      '/v1/images/pull',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            "Pull an image from an OCI registry (by tag or @sha256 digest) into the caller's project (an admin key: shared): a dsec image, or a container image (linux on this host's architecture) imported as /v1/images/import does; blobs are verified, broken downloads resume with Range requests",
          body: PullImageRequest,
          response: { 201: PullImageResult, ...errors },
        },
      },
      async (req, reply) => {
        const caller = req.caller;
        const ref = parseRef(req.body.ref);
        checkRegistry(caller, ref);
        const name = req.body.name ?? defaultPullName(ref);
        // Refused before any transfer, and checked again before the name moves.
        if (name !== undefined) await projectImages.checkPullName(caller, name);
        let pulled;
        try {
          pulled = await pullImage(images, clientFor(ref, req.log), ref, {
            name,
            tag: false,
            // The owner row goes in before the image is recorded: it is never visible as shared.
            adopt: async (id) => {
              if (caller.admin) return;
              const existed = (await projectImages.resolve(undefined, id)) !== undefined;
              await projectImages.claim(caller.project, id, existed);
            },
            progress: (line) => req.log.info({ pull: req.body.ref }, line),
          });
        } catch (err) {
          throw transferError(err, ref, accountNote(ref));
        }
        if (name !== undefined) {
          const owner = await projectImages.checkPullName(caller, name);
          await projectImages.recordName(name, owner);
          images.tag(name, pulled.id);
        }
        const { digest, fetchedLayers, bytes, resumes } = pulled;
        const image = await projectImages.info(caller.admin ? undefined : caller.project, pulled.id);
        return await reply.status(201).send({ image: image!, digest, fetchedLayers, bytes, resumes });
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
function transferError(err: unknown, ref: RegistryRef, accountNote?: string): unknown {
  if (!(err instanceof ImageTransferError)) return err;
  const details = {
    registry: ref.host,
    repository: ref.repository,
    ...(err instanceof RegistryError && err.status !== undefined ? { registryStatus: err.status, registryCodes: err.codes } : {}),
  };
  if (err instanceof RegistryAuthError)
    return new ApiError('REGISTRY_AUTH_FAILED', accountNote ? `${err.message} (${accountNote})` : err.message, details);
  if (err instanceof RegistryError && err.status === 404) return new ApiError('IMAGE_NOT_FOUND', err.message, details);
  if (err instanceof RegistryError && (err.status === undefined || err.status >= 500))
    return new ApiError('REGISTRY_UNAVAILABLE', err.message, details);
  return new ApiError('INVALID_REQUEST', err.message, details);
}
