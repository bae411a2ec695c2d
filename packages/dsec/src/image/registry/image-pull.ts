import { createWriteStream, rmSync, statSync } from 'node:fs';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ImageConfig } from '@dsec/sdk/schema';
import { isImageName, type ImageId, type ImageStore } from '../image-store.js';
import { sha256File, type LayerDigest } from '../layer-store.js';
import { parseDsecManifest, sha256Digest, type Descriptor } from './dsec-artifact.js';
import { ImageTransferError, RegistryError, describeFetchError, type RegistryClient } from './registry-client.js';
import type { RegistryRef } from './registry-ref.js';

export interface PullResult {
  id: ImageId;
  /** The manifest digest the image was pulled by. */
  digest: string;
  name: string | undefined;
  /** Layers fetched (the others were in the layer store already). */
  fetchedLayers: number;
  bytes: number;
  /** Times a layer download broke off and went on from where it stopped (a Range request). */
  resumes: number;
}

export interface PullOptions {
  /** Tag the pulled image with this name (default: the repository's last component and the tag). */
  name?: string | undefined;
  progress?: (line: string) => void;
  /** Bytes of a layer arrived (for progress bars, and for tests that break a pull in the middle). */
  onBytes?: (layer: string, received: number, size: number) => void;
  /** How many times one layer may break off and resume before the pull fails (default 20). */
  maxResumes?: number;
  /** false: store the image but give it no name (the caller names it); `name` is still reported. */
  tag?: boolean;
  /**
   * Called with the image's id once its layers are verified and before the image is recorded (the
   * control plane records which project owns it first, so it is never visible as shared). A throw
   * stops the pull before the image is recorded.
   */
  adopt?: (id: ImageId) => Promise<void>;
}

/**
 * Pulls a dsec image: the manifest (by tag, then everything by its digest), the config blob, and
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
  let resumes = 0;
  try {
    for (;;) {
      const have = sizeOf(tmp);
      if (have >= layer.size) break;
      try {
        const { body } = await client.getBlob(layer.digest, have > 0 ? { start: have } : undefined);
        let received = have;
        const count = new Transform({
          transform(chunk: Buffer, _e, cb) {
            received += chunk.length;
            opts.onBytes?.(layer.digest, received, layer.size);
            cb(null, chunk);
          },
        });
        const out = createWriteStream(tmp, { flags: 'a', mode: 0o644 });
        // The size of the file decides where the next attempt starts: every write of this one must
        // have landed first (a write still in flight after a broken pipeline would duplicate bytes).
        const closed = new Promise<void>((r) => out.once('close', () => r()));
        try {
          await pipeline(body, count, out);
        } finally {
          out.destroy();
          await closed;
        }
        if (sizeOf(tmp) >= layer.size) break;
      } catch (err) {
        if (err instanceof RegistryError) throw err; // the client retried already, or it is not worth retrying
        if (resumes >= opts.maxResumes)
          throw new RegistryError(
            `registry ${client.ref.host}: the download of layer ${layer.digest} broke off ${resumes + 1} times (${describeFetchError(err)})`,
          );
      }
      // The body ended early or broke off: go on from what arrived.
      resumes++;
      opts.progress?.(`layer ${layer.digest.slice(7, 19)}: the download broke off at ${sizeOf(tmp)} of ${layer.size} bytes; resuming`);
    }
    if (sizeOf(tmp) !== layer.size)
      throw new RegistryError(
        `registry ${client.ref.host}: layer ${layer.digest} is ${sizeOf(tmp)} bytes, the manifest says ${layer.size}`,
      );
    const got = await sha256File(tmp);
    if (got !== layer.digest)
      throw new RegistryError(
        `registry ${client.ref.host}: layer ${layer.digest} arrived with other bytes (they hash to ${got}); nothing was stored`,
      );
    await images.layers.add(tmp);
    return { resumes };
  } finally {
    rmSync(tmp, { force: true });
  }
}

function sizeOf(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}
