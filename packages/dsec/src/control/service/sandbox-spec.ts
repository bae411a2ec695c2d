import type { CreateSandboxRequest, ImageConfig, NetworkPolicyRequest, SandboxInfo } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeNetworkRequest, SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { ImageId, ImageStore } from '../../image/image-store.js';
import { isLayerDigest, type LayerDigest } from '../../image/layer-store.js';
import { allowEntryError } from '../../net/policy.js';
import type { ProjectImages } from '../project-images.js';
import type { MaybePromise } from '../../maybe-promise.js';
import { DEFAULT_LIMITS, newSandboxId } from '../sandbox-ids.js';
import { isoTime } from '../iso-time.js';
import { checkVolumeMounts } from './volumes.js';

/** A create's limits: the defaults for every one not given. */
export function limitsFor(req: CreateSandboxRequest): SandboxLimits {
  return { ...DEFAULT_LIMITS, ...req.resources };
}

/** A create's image resolved: its id, its layers bottom first, its config. */
export interface ComposedSpec {
  imageId: ImageId;
  layers: LayerDigest[];
  /** Frozen (ImageStore.manifest): shared by every create of the image. */
  config: ImageConfig;
}

function notFound(ref: string): ApiError {
  return new ApiError(
    'IMAGE_NOT_FOUND',
    `no image ${JSON.stringify(ref)}; list images with \`dsec image ls\` or build one with \`dsec image build busybox\``,
    { image: ref },
  );
}

/**
 * What a create request resolves to before it is placed: its image and layers (only those the
 * project may use), and the checks a spec passes before any sandbox is made for it.
 */
export class SandboxSpecs {
  constructor(private readonly deps: { images: ImageStore; projectImages: ProjectImages }) {}

  /**
   * Base image plus stacked images or layer digests, bottom first; shared layers appear once. At
   * once for the common create (an image known here, its owners kept in memory, no layers
   * stacked): every create composes. Never throws: a refusal is a rejected promise.
   */
  composeLayers(req: CreateSandboxRequest, project: string): MaybePromise<ComposedSpec> {
    try {
      const imageId = this.deps.projectImages.resolve(project, req.image);
      if (imageId instanceof Promise || req.layers?.length) return this.#composeStacked(req, project, imageId);
      return this.#base(req.image, imageId);
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  async #composeStacked(req: CreateSandboxRequest, project: string, resolving: MaybePromise<ImageId | undefined>): Promise<ComposedSpec> {
    const base = this.#base(req.image, await resolving);
    const layers = base.layers;
    for (const ref of req.layers ?? []) {
      let extra: LayerDigest[];
      // A digest that only other projects' private images hold answers as an unknown one.
      if (isLayerDigest(ref) && (await this.deps.projectImages.layerVisible(project, ref)) && (await this.deps.images.layers.fetch(ref)))
        extra = [ref];
      else {
        const id = await this.deps.projectImages.resolve(project, ref);
        const m = id && this.deps.images.get(id);
        if (!m) throw notFound(ref);
        extra = m.layers;
      }
      for (const l of extra) if (!layers.includes(l)) layers.push(l);
    }
    return base;
  }

  /**
   * The image's own layers and config: a copy of its layer list, which stacked layers extend, and
   * its config as the image store keeps it (frozen, shared by every create of the image).
   */
  #base(ref: string, imageId: ImageId | undefined): ComposedSpec {
    const manifest = imageId && this.deps.images.manifest(imageId);
    if (!imageId || !manifest) throw notFound(ref);
    return { imageId, layers: [...manifest.layers], config: manifest.config };
  }

  /** Everything about a spec that can be checked without placing it: image, layers, network syntax. */
  async checkSpec(req: CreateSandboxRequest, project: string = DEFAULT_PROJECT): Promise<void> {
    await this.composeLayers(req, project);
    if (req.network) checkPolicy(req.network);
    checkVolumeMounts(req);
  }
}

/** The record of a sandbox just placed on `edge`, status creating, as create and createGroup write it. */
export function newSandboxInfo(
  req: CreateSandboxRequest,
  edge: string,
  imageId: string,
  limits: SandboxLimits,
  layers: string[],
  extraLabels: Record<string, string>,
  project: string,
): SandboxInfo {
  const now = Date.now();
  const info: SandboxInfo = {
    id: newSandboxId(edge),
    edge,
    project,
    backend: req.backend ?? 'container',
    status: 'creating',
    image: req.image,
    imageId,
    resources: limits,
    labels: { ...(req.labels ?? {}), ...extraLabels },
    layers,
    createdAt: isoTime(now),
    onExpiry: req.onExpiry ?? 'stop',
    lastActivityAt: isoTime(now),
  };
  if (req.ttlSeconds !== undefined) {
    info.ttlSeconds = req.ttlSeconds;
    info.expiresAt = new Date(now + req.ttlSeconds * 1000).toISOString();
  }
  if (req.idleTimeoutSeconds !== undefined) info.idleTimeoutSeconds = req.idleTimeoutSeconds;
  return info;
}

/**
 * The allow list's syntax, checked here so a bad entry is a 400 before any placement; host names
 * are resolved by the edge that enforces the rules (DNS is a fact of its node).
 */
export function checkPolicy(req: NetworkPolicyRequest): EdgeNetworkRequest {
  if (req.mode !== 'allow' && req.allow?.length) {
    throw new ApiError('INVALID_REQUEST', `allow entries only apply to mode "allow", not "${req.mode}"`, { field: 'allow' });
  }
  if (req.mode === 'allow' && !req.allow?.length) {
    throw new ApiError(
      'INVALID_REQUEST',
      'mode "allow" needs at least one allow entry (CIDR, CIDR:port, host or host:port); use mode "none" to allow nothing',
      {
        field: 'allow',
      },
    );
  }
  const allow = req.mode === 'allow' ? (req.allow ?? []) : [];
  for (const entry of allow) {
    const err = allowEntryError(entry);
    if (err) throw new ApiError('INVALID_REQUEST', err, { field: 'allow' });
  }
  return { mode: req.mode, allow };
}
