import { rmSync } from 'node:fs';
import type { ImageConfig } from '@dsec/sdk/schema';
import { isImageName, type ImageStore } from '../image-store.js';
import type { LayerDigest } from '../layer-store.js';
import { downloadBlob } from './blob-download.js';
import { isContainerManifest, pullContainerImage } from './container-pull.js';
import { parseDsecManifest, sha256Digest, type Descriptor } from './dsec-artifact.js';
import type { PullOptions, PullResult } from './pull-types.js';
import { ImageTransferError, RegistryError, type RegistryClient } from './registry-client.js';
import type { RegistryRef } from './registry-ref.js';

export type { PullOptions, PullResult } from './pull-types.js';

/**
 * Pulls an image: a container image (container-pull.ts), or a dsec image: the manifest (by tag, then everything by its digest), the config blob, and
 * each layer the layer store lacks. A layer is downloaded to a temp file; when the connection
 * breaks (the registry restarts, a proxy drops it) the download goes on from the bytes it has with
 * a Range request, and the finished file enters the store only if it hashes to its digest. The
 * image record is written last, so a failed pull leaves no image behind (only whole, verified
 * layers, which GC frees if nothing uses them).
 */
export async function pullImage(images: ImageStore, client: RegistryClient, ref: RegistryRef, opts: PullOptions = {}): Promise<PullResult> {
  const progress = opts.progress ?? (() => {});
  const reference = ref.digest ?? ref.tag ?? 'latest';
  const where = `${ref.host}/${ref.repository}${ref.digest ? `@${ref.digest}` : `:${reference}`}`;
  const got = await client.getManifest(reference);
  if (!got) throw new RegistryError(`registry ${ref.host}: no manifest ${where}`, 404, ['MANIFEST_UNKNOWN']);
  const digest = sha256Digest(got.bytes);
  if (ref.digest && digest !== ref.digest) throw new RegistryError(`registry ${ref.host}: the manifest of ${where} hashes to ${digest}`);
  if (isContainerManifest(got.bytes, got.mediaType)) return pullContainerImage(images, client, ref, got, opts);
  const manifest = parseDsecManifest(got.bytes, got.mediaType, `the manifest of ${where}`);
  progress(`manifest ${digest} (${manifest.layers.length} layers)`);

  const configBytes = await fetchSmallBlob(client, manifest.config);
  const config = (JSON.parse(configBytes.toString('utf8')) as { config?: ImageConfig }).config;
  if (!config || typeof config !== 'object') throw new ImageTransferError(`the config blob of ${where} holds no image config`);

  let fetchedLayers = 0;
  let bytes = 0;
  let resumes = 0;
  for (const [i, layer] of manifest.layers.entries()) {
    const d = layer.digest as LayerDigest;
    if (images.layers.has(d)) {
      progress(`layer ${i + 1}/${manifest.layers.length} ${d.slice(7, 19)} already here`);
      continue;
    }
    const r = await fetchLayer(images, client, layer, { ...opts, maxResumes: opts.maxResumes ?? 20 });
    resumes += r.resumes;
    fetchedLayers++;
    bytes += layer.size;
    progress(
      `layer ${i + 1}/${manifest.layers.length} ${d.slice(7, 19)} fetched (${layer.size} bytes${r.resumes ? `, resumed ${r.resumes}x` : ''})`,
    );
  }

  const body = { layers: manifest.layers.map((l) => l.digest as LayerDigest), config };
  await opts.adopt?.(images.idOf(body));
  const id = await images.put(body);
  const name = opts.name ?? defaultPullName(ref);
  if (name !== undefined && opts.tag !== false) await images.tag(name, id);
  return { id, digest, name, fetchedLayers, bytes, resumes };
}

/** `host/team/busybox:v1` → `busybox:v1`, when that is a valid local name. */
export function defaultPullName(ref: Pick<RegistryRef, 'repository' | 'tag'>): string | undefined {
  if (ref.tag === undefined) return undefined;
  const name = `${ref.repository.split('/').pop()}:${ref.tag}`;
  return isImageName(name) ? name : undefined;
}

async function fetchSmallBlob(client: RegistryClient, d: Descriptor): Promise<Buffer> {
  const { body } = await client.getBlob(d.digest);
  const parts: Buffer[] = [];
  for await (const c of body) parts.push(c as Buffer);
  const bytes = Buffer.concat(parts);
  if (sha256Digest(bytes) !== d.digest)
    throw new RegistryError(`registry ${client.ref.host}: blob ${d.digest} arrived with other bytes (${sha256Digest(bytes)})`);
  return bytes;
}

async function fetchLayer(
  images: ImageStore,
  client: RegistryClient,
  layer: Descriptor,
  opts: PullOptions & { maxResumes: number },
): Promise<{ resumes: number }> {
  const tmp = images.layers.tempPath();
  try {
    const r = await downloadBlob(client, layer, tmp, opts);
    await images.layers.add(tmp);
    return r;
  } finally {
    rmSync(tmp, { force: true });
  }
}
