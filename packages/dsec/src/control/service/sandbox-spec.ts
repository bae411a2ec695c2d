import type { CreateSandboxRequest, ImageConfig, NetworkPolicyRequest, SandboxInfo } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeNetworkRequest, SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { ImageId, ImageStore } from '../../image/image-store.js';
import { isLayerDigest, type LayerDigest } from '../../image/layer-store.js';
import { allowEntryError } from '../../net/policy.js';
import type { ProjectImages } from '../project-images.js';
import { DEFAULT_LIMITS, newSandboxId } from '../sandbox-ids.js';
import { isoTime } from '../iso-time.js';
import { checkVolumeMounts } from './volumes.js';

/** A create's limits: the defaults for every one not given. */
export function limitsFor(req: CreateSandboxRequest): SandboxLimits {
  return { ...DEFAULT_LIMITS, ...req.resources };
}

/**
 * What a create request resolves to before it is placed: its image and layers (only those the
 * project may use), and the checks a spec passes before any sandbox is made for it.
 */
export class SandboxSpecs {
  constructor(private readonly deps: { images: ImageStore; projectImages: ProjectImages }) {}

  /** Base image plus stacked images or layer digests, bottom first; shared layers appear once. */
  async composeLayers(
    req: CreateSandboxRequest,
    project: string,
  ): Promise<{ imageId: ImageId; layers: LayerDigest[]; config: ImageConfig }> {
    const notFound = (ref: string): ApiError =>
      new ApiError(
        'IMAGE_NOT_FOUND',
        `no image ${JSON.stringify(ref)}; list images with \`dsec image ls\` or build one with \`dsec image build busybox\``,
        {
          image: ref,
        },
      );
    // Only images the project may use (its own and shared ones: docs/PROJECTS.md).
    const imageId = await this.deps.projectImages.resolve(project, req.image);
    const manifest = imageId && this.deps.images.get(imageId);
    if (!imageId || !manifest) throw notFound(req.image);
    const layers: LayerDigest[] = [...manifest.layers];
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
    return { imageId, layers, config: manifest.config };
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
