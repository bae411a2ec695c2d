import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageStore } from '../image-store.js';
import { ImportError, importLayoutDir, type ImportOptions } from '../oci-import.js';
import { hostArchitecture } from '../oci/image-ref.js';
import { stagingPrefix } from '../staging.js';
import { sha256Digest, type Descriptor } from './dsec-artifact.js';
import { downloadBlob } from './blob-download.js';
import type { PullOptions, PullResult } from './pull-types.js';
import { ImageTransferError, RegistryError, type RegistryClient } from './registry-client.js';
import type { RegistryRef } from './registry-ref.js';

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const MANIFEST_TYPES = new Set(['application/vnd.oci.image.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v2+json']);

interface IndexEntry extends Descriptor {
  platform?: { os?: string; architecture?: string; variant?: string };
}

/**
 * Pulls a container image (what `docker push` puts in a registry: an OCI or Docker v2 manifest,
 * or an index of them per platform) and imports it as a dsec image.
 *
 * The blobs are fetched into a scratch OCI image layout (the manifest for linux on this host's
 * architecture, its config and its layers, each checked against its digest, broken downloads
 * resumed) and that layout goes through `dsec image import`'s path (oci-import.ts): the same
 * checks of every blob and diff_id, safe unpacking, whiteouts, one EROFS layer per layer and the
 * import cache by diff_id. A second pull of an image whose layers were imported before converts
 * nothing again.
 */
export async function pullContainerImage(
  images: ImageStore,
  client: RegistryClient,
  ref: RegistryRef,
  top: { bytes: Buffer; mediaType: string },
  opts: PullOptions & Pick<ImportOptions, 'squash'>,
): Promise<PullResult> {
  const progress = opts.progress ?? (() => {});
  const where = `${ref.host}/${ref.repository}`;
  const scratch = mkdtempSync(join(images.layers.tmpDir, stagingPrefix('pull')));
  try {
    const layout = join(scratch, 'layout');
    const blobs = join(layout, 'blobs', 'sha256');
    mkdirSync(blobs, { recursive: true });
    const put = (bytes: Buffer): string => {
      const digest = sha256Digest(bytes);
      writeFileSync(join(blobs, digest.slice(7)), bytes);
      return digest;
    };
    // The manifest for this platform: the top one, or the one an index names for linux/ARCH.
    let manifestBytes = top.bytes;
    let mediaType = typeOf(top.bytes, top.mediaType);
    if (INDEX_TYPES.has(mediaType)) {
      const index = parse<{ manifests?: IndexEntry[] }>(top.bytes, `the index of ${where}`);
      const arch = hostArchitecture();
      const mine = (index.manifests ?? []).filter(
        (m) => m.platform?.os === 'linux' && m.platform.architecture === arch && (!m.mediaType || MANIFEST_TYPES.has(m.mediaType)),
      );
      const chosen = mine[0];
      if (!chosen) {
        const has = (index.manifests ?? []).map((m) => `${m.platform?.os ?? '?'}/${m.platform?.architecture ?? '?'}`);
        throw new ImageTransferError(`${where} has no linux/${arch} image (it has ${[...new Set(has)].join(', ') || 'none'})`);
      }
      const got = await client.getManifest(chosen.digest);
      if (!got) throw new RegistryError(`registry ${ref.host}: the index of ${where} names ${chosen.digest}, which it does not hold`, 404);
      if (sha256Digest(got.bytes) !== chosen.digest)
        throw new RegistryError(`registry ${ref.host}: manifest ${chosen.digest} arrived with other bytes`);
      manifestBytes = got.bytes;
      mediaType = typeOf(got.bytes, got.mediaType);
    }
    if (!MANIFEST_TYPES.has(mediaType))
      throw new ImageTransferError(`${where} is a ${mediaType || 'manifest of unknown type'}: neither a container image nor a dsec image`);
    const manifestDigest = put(manifestBytes);
    const manifest = parse<{ config?: Descriptor; layers?: Descriptor[] }>(manifestBytes, `the manifest of ${where}`);
    if (!manifest.config || !Array.isArray(manifest.layers))
      throw new ImageTransferError(`the manifest of ${where} has no config or no layers`);
    progress(`container image ${manifestDigest} (${manifest.layers.length} layers)`);
    let bytes = 0;
    let resumes = 0;
    for (const [i, blob] of [manifest.config, ...manifest.layers].entries()) {
      if (!/^sha256:[0-9a-f]{64}$/.test(String(blob.digest)) || !Number.isSafeInteger(blob.size) || blob.size < 0)
        throw new ImageTransferError(`the manifest of ${where} has a malformed descriptor ${JSON.stringify(blob)}`);
      const r = await downloadBlob(client, blob, join(blobs, blob.digest.slice(7)), { ...opts, maxResumes: opts.maxResumes ?? 20 });
      resumes += r.resumes;
      bytes += blob.size;
      if (i > 0) progress(`layer ${i}/${manifest.layers.length} ${blob.digest.slice(7, 19)} fetched (${blob.size} bytes)`);
    }
    const name = `${ref.host}/${ref.repository}${ref.tag ? `:${ref.tag}` : ''}`;
    writeFileSync(join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
    writeFileSync(
      join(layout, 'index.json'),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [
          { mediaType, digest: manifestDigest, size: manifestBytes.length, annotations: { 'org.opencontainers.image.ref.name': name } },
        ],
      }),
    );
    const imported = await importLayoutDir(images, layout, scratch, {
      ...(opts.name !== undefined ? { name: opts.name } : {}),
      ...(opts.squash ? { squash: true } : {}),
      tag: opts.tag !== false,
      ...(opts.adopt ? { beforeRecord: opts.adopt } : {}),
      progress,
    }).catch((err: unknown) => {
      // What the import finds wrong with the image is the registry's image's fault: a transfer error (400).
      throw err instanceof ImportError ? new ImageTransferError(`${where}: ${err.message}`) : err;
    });
    return {
      id: imported.id,
      digest: sha256Digest(top.bytes),
      name: imported.name,
      fetchedLayers: manifest.layers.length,
      bytes,
      resumes,
    };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** A manifest's media type: its own field, else the one the registry answered with. */
function typeOf(bytes: Buffer, answered: string): string {
  const own = parse<{ mediaType?: unknown }>(bytes, 'a manifest').mediaType;
  return typeof own === 'string' ? own : answered.split(';')[0]!.trim();
}

function parse<T>(bytes: Buffer, what: string): T {
  try {
    return JSON.parse(bytes.toString('utf8')) as T;
  } catch {
    throw new ImageTransferError(`${what} is not JSON`);
  }
}

/** Whether manifest bytes are a container image (or an index of them) rather than a dsec image. */
export function isContainerManifest(bytes: Buffer, answered: string): boolean {
  try {
    const type = typeOf(bytes, answered);
    if (INDEX_TYPES.has(type)) return true;
    const m = JSON.parse(bytes.toString('utf8')) as { config?: { mediaType?: string } };
    return MANIFEST_TYPES.has(type) && m.config?.mediaType !== 'application/vnd.dsec.image.config.v1+json';
  } catch {
    return false;
  }
}
