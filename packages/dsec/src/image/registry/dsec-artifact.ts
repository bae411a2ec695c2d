import { createHash } from 'node:crypto';
import type { ImageConfig } from '@dsec/sdk/schema';
import { ImageTransferError } from './registry-client.js';

/**
 * How a dsec image travels through an OCI registry: an OCI image manifest (an artifact in OCI 1.1
 * terms) whose layers are the image's EROFS blobs, bottom first, and whose config blob holds the
 * image config. The media types are dsec's own, so container tools do not mistake it for a
 * container image, and dsec refuses manifests that are not one of its own.
 */
export const OCI_MANIFEST_MEDIA_TYPE = 'application/vnd.oci.image.manifest.v1+json';
/** The manifest's `artifactType`. */
export const DSEC_ARTIFACT_TYPE = 'application/vnd.dsec.image.v1';
/** The config blob: `{"config": ImageConfig}` (env, cwd, user, entrypoint, cmd, labels). */
export const DSEC_CONFIG_MEDIA_TYPE = 'application/vnd.dsec.image.config.v1+json';
/** Each layer: one EROFS image, uncompressed by the transport (EROFS compresses inside). */
export const DSEC_LAYER_MEDIA_TYPE = 'application/vnd.dsec.image.layer.v1.erofs';

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
}

export interface OciManifest {
  schemaVersion: 2;
  mediaType: string;
  artifactType?: string;
  config: Descriptor;
  layers: Descriptor[];
  annotations?: Record<string, string>;
}

export function sha256Digest(bytes: Buffer): `sha256:${string}` {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

export function configBlob(config: ImageConfig): Buffer {
  return Buffer.from(JSON.stringify({ config }));
}

export function dsecManifest(config: Buffer, layers: { digest: string; size: number }[], createdAt: string): OciManifest {
  return {
    schemaVersion: 2,
    mediaType: OCI_MANIFEST_MEDIA_TYPE,
    artifactType: DSEC_ARTIFACT_TYPE,
    config: { mediaType: DSEC_CONFIG_MEDIA_TYPE, digest: sha256Digest(config), size: config.length },
    layers: layers.map((l) => ({ mediaType: DSEC_LAYER_MEDIA_TYPE, digest: l.digest, size: l.size })),
    annotations: { 'org.opencontainers.image.created': createdAt },
  };
}

const DIGEST = /^sha256:[0-9a-f]{64}$/;

/**
 * Checks that manifest bytes are a dsec image and returns the parsed manifest; the error says what
 * the manifest is instead (a container image goes through `dsec image import`).
 */
export function parseDsecManifest(bytes: Buffer, mediaType: string, where: string): OciManifest {
  let m: OciManifest;
  try {
    m = JSON.parse(bytes.toString('utf8')) as OciManifest;
  } catch {
    throw new ImageTransferError(`${where} is not JSON`);
  }
  const type = m.mediaType ?? mediaType;
  if (type !== OCI_MANIFEST_MEDIA_TYPE) {
    throw new ImageTransferError(
      `${where} is a ${type || 'manifest of unknown type'}, not a dsec image (an OCI manifest with config type ${DSEC_CONFIG_MEDIA_TYPE}); container images come in through \`dsec image import\``,
    );
  }
  if (m.config?.mediaType !== DSEC_CONFIG_MEDIA_TYPE) {
    throw new ImageTransferError(
      `${where} has config type ${JSON.stringify(m.config?.mediaType)}, not ${DSEC_CONFIG_MEDIA_TYPE}: it is not a dsec image (container images come in through \`dsec image import\`)`,
    );
  }
  const descriptors = [m.config, ...(Array.isArray(m.layers) ? m.layers : [])];
  for (const d of descriptors) {
    if (!DIGEST.test(String(d.digest)) || !Number.isSafeInteger(d.size) || d.size < 0)
      throw new ImageTransferError(`${where} has a malformed descriptor ${JSON.stringify(d)}`);
  }
  if (!Array.isArray(m.layers) || m.layers.length === 0) throw new ImageTransferError(`${where} has no layers`);
  for (const l of m.layers)
    if (l.mediaType !== DSEC_LAYER_MEDIA_TYPE)
      throw new ImageTransferError(`${where} has a layer of type ${JSON.stringify(l.mediaType)}, not ${DSEC_LAYER_MEDIA_TYPE}`);
  return m;
}
