import { readFileSync } from 'node:fs';
import { sha256File } from '../layer-store.js';
import { checkDigest, parseJson, resolveIn } from './archive-files.js';
import { sniffFile } from './decompress.js';
import { refMatches } from './image-ref.js';
import { ImportError, type ImportOptions, type OciImageConfig, type SourceImage } from './import-types.js';
import { cleanArchivePath } from './safe-extract.js';

export async function readDockerSave(root: string, opts: ImportOptions): Promise<SourceImage> {
  const entries = parseJson<{ Config?: string; RepoTags?: string[] | null; Layers?: string[] }[]>(
    readFileSync(resolveIn(root, 'manifest.json'), 'utf8'),
    'manifest.json',
  );
  if (!Array.isArray(entries) || entries.length === 0) throw new ImportError('manifest.json lists no image');
  let chosen = entries;
  if (opts.ref) {
    chosen = entries.filter((e) => (e.RepoTags ?? []).some((t) => refMatches(t, opts.ref!)));
    if (!chosen.length)
      throw new ImportError(
        `no image tagged ${JSON.stringify(opts.ref)} in the archive (it has: ${entries.flatMap((e) => e.RepoTags ?? []).join(', ') || 'none'})`,
      );
  }
  if (chosen.length > 1) {
    throw new ImportError(
      `the archive holds ${chosen.length} images (${chosen.map((e) => e.RepoTags?.join(' ') ?? e.Config).join(', ')}); pick one with ref`,
    );
  }
  const e = chosen[0]!;
  if (!e.Config || !Array.isArray(e.Layers)) throw new ImportError('manifest.json: the image has no Config or no Layers');
  const configFile = resolveIn(root, e.Config);
  const configDigest = await sha256File(configFile);
  // The config's file name is its digest (`<hex>.json`, or `blobs/sha256/<hex>` since Docker 25).
  const named = /(?:^|\/)([0-9a-f]{64})(?:\.json)?$/.exec(e.Config)?.[1];
  if (named && `sha256:${named}` !== configDigest)
    throw new ImportError(`digest mismatch: image config ${e.Config} has sha256 ${configDigest}`);
  const config = parseJson<OciImageConfig>(readFileSync(configFile, 'utf8'), 'image config');
  const diffIds = config.rootfs?.diff_ids ?? [];
  if (diffIds.length !== e.Layers.length)
    throw new ImportError(`the image config lists ${diffIds.length} diff_ids but manifest.json has ${e.Layers.length} layers`);
  const layers: SourceImage['layers'] = [];
  for (const [i, rel] of e.Layers.entries()) {
    const file = resolveIn(root, rel);
    const diffId = checkDigest(diffIds[i]!, `diff_id ${i + 1}`);
    const blobHex = /^blobs\/sha256\/([0-9a-f]{64})$/.exec(cleanArchivePath(rel) ?? '')?.[1];
    // An uncompressed layer is its own diff_id: check it before unpacking anything.
    const expected = blobHex ? `sha256:${blobHex}` : sniffFile(file) === 'none' ? diffId : undefined;
    if (expected) {
      const actual = await sha256File(file);
      if (actual !== expected)
        throw new ImportError(`digest mismatch: layer ${i + 1} (${rel}) should have sha256 ${expected} but has ${actual}`);
    }
    layers.push({ file, diffId, label: `layer ${i + 1} (${rel})` });
  }
  return { format: 'docker-save', refName: e.RepoTags?.[0], configDigest, config, layers };
}
