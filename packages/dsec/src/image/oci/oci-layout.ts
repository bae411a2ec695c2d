import { readFileSync } from 'node:fs';
import { checkDigest, parseJson, resolveIn, verifiedBlob } from './archive-files.js';
import { hostArchitecture, refMatches } from './image-ref.js';
import { type Descriptor, ImportError, type ImportOptions, type OciImageConfig, type SourceImage } from './import-types.js';

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const MANIFEST_TYPES = new Set(['application/vnd.oci.image.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v2+json']);
const LAYER_TYPE =
  /^application\/vnd\.(oci\.image\.layer(\.nondistributable)?\.v1\.tar|docker\.image\.rootfs(\.foreign)?\.diff\.tar)(\.gzip|\+gzip|\+zstd|\.zstd)?$/;

export async function readOciLayout(root: string, opts: ImportOptions): Promise<SourceImage> {
  const indexFile = resolveIn(root, 'index.json');
  const index = parseJson<{ manifests?: Descriptor[] }>(readFileSync(indexFile, 'utf8'), 'index.json');
  const found: { desc: Descriptor; ref?: string }[] = [];
  const skipped: string[] = [];
  const walk = async (idx: { manifests?: Descriptor[] }, inheritedRef: string | undefined, depth: number): Promise<void> => {
    if (depth > 4) throw new ImportError('image indexes nest too deeply');
    for (const m of idx.manifests ?? []) {
      const ref = m.annotations?.['io.containerd.image.name'] ?? m.annotations?.['org.opencontainers.image.ref.name'] ?? inheritedRef;
      if (m.mediaType && INDEX_TYPES.has(m.mediaType)) {
        const file = await verifiedBlob(root, m, 'image index');
        await walk(parseJson(readFileSync(file, 'utf8'), `index ${m.digest}`), ref, depth + 1);
        continue;
      }
      if (m.mediaType && !MANIFEST_TYPES.has(m.mediaType)) continue;
      if (m.annotations?.['vnd.docker.reference.type'] === 'attestation-manifest') continue;
      const p = m.platform;
      if (p && ((p.os && p.os !== 'linux') || (p.architecture && p.architecture !== hostArchitecture()))) {
        skipped.push(`${p.os ?? '?'}/${p.architecture ?? '?'}`);
        continue;
      }
      found.push({ desc: m, ref });
    }
  };
  await walk(index, undefined, 0);
  let chosen = found;
  if (opts.ref) {
    chosen = found.filter((f) => refMatches(f.ref, opts.ref!));
    if (!chosen.length)
      throw new ImportError(
        `no image named ${JSON.stringify(opts.ref)} in the archive (it has: ${found.map((f) => f.ref ?? f.desc.digest).join(', ') || 'none'})`,
      );
  }
  if (!chosen.length) {
    throw new ImportError(
      `the archive has no linux/${hostArchitecture()} image${skipped.length ? ` (it has ${[...new Set(skipped)].join(', ')})` : ''}`,
    );
  }
  const distinct = new Set(chosen.map((c) => c.desc.digest));
  if (distinct.size > 1) {
    throw new ImportError(
      `the archive holds ${distinct.size} images (${chosen.map((c) => c.ref ?? c.desc.digest).join(', ')}); pick one with ref`,
    );
  }
  const { desc, ref } = chosen[0]!;
  const manifestFile = await verifiedBlob(root, desc, 'image manifest');
  const manifest = parseJson<{ config?: Descriptor; layers?: Descriptor[] }>(readFileSync(manifestFile, 'utf8'), `manifest ${desc.digest}`);
  if (!manifest.config || !Array.isArray(manifest.layers)) throw new ImportError(`manifest ${desc.digest} has no config or no layers`);
  const configFile = await verifiedBlob(root, manifest.config, 'image config');
  const config = parseJson<OciImageConfig>(readFileSync(configFile, 'utf8'), 'image config');
  const diffIds = config.rootfs?.diff_ids ?? [];
  if (diffIds.length !== manifest.layers.length) {
    throw new ImportError(`the image config lists ${diffIds.length} diff_ids but the manifest has ${manifest.layers.length} layers`);
  }
  const layers: SourceImage['layers'] = [];
  for (const [i, l] of manifest.layers.entries()) {
    if (l.mediaType && !LAYER_TYPE.test(l.mediaType))
      throw new ImportError(`layer ${i + 1} has media type ${l.mediaType}, which is not a tar layer`);
    const file = await verifiedBlob(root, l, `layer ${i + 1}`);
    layers.push({ file, diffId: checkDigest(diffIds[i]!, `diff_id ${i + 1}`), label: `layer ${i + 1} (${l.digest.slice(0, 19)})` });
  }
  return { format: 'oci-layout', refName: ref, manifestDigest: desc.digest, configDigest: manifest.config.digest, config, layers };
}
