import { createReadStream, existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { type ImageStore, isImageName } from './image-store.js';
import { isLayerDigest } from './layer-digest.js';
import { CompressionError, decompressStream } from './oci/decompress.js';
import { readDockerSave } from './oci/docker-save.js';
import { imageConfigFor } from './oci/image-config.js';
import { dsecNameFor } from './oci/image-ref.js';
import { ImportError, type ImportOptions, type ImportResult, type SourceImage } from './oci/import-types.js';
import { importEachLayer, importSquashed, readCache, writeCache } from './oci/layer-import.js';
import { readOciLayout } from './oci/oci-layout.js';
import { UnsafeArchiveError, extractTarSafely } from './oci/safe-extract.js';
import { TarFormatError } from './oci/tar-reader.js';
import { stagingPrefix } from './staging.js';

/**
 * Imports container images made elsewhere: an OCI image layout (a directory, or a tar of one) or
 * a `docker save` archive (the legacy manifest.json form and the OCI index.json form of Docker
 * 25+). Every blob is checked against its sha256 digest, every layer against the config's
 * diff_id; each layer is unpacked safely (see oci/safe-extract.ts) with OCI whiteouts turned
 * into overlayfs ones, and becomes one EROFS layer (or all of them one, with `squash`). The
 * image config (Env, WorkingDir, User, Entrypoint, Cmd, Labels) becomes dsec's ImageConfig.
 */

export { dsecNameFor, ImportError };
export type { ImportFormat, ImportedLayer, ImportOptions, ImportResult } from './oci/import-types.js';

async function importSource(
  store: ImageStore,
  src: SourceImage,
  scratch: string,
  opts: ImportOptions,
  warnings: string[],
): Promise<ImportResult> {
  const progress = opts.progress ?? (() => {});
  const warn = (m: string): void => {
    warnings.push(m);
    progress(`warning: ${m}`);
  };
  const compression = opts.compression ?? 'lz4';
  const name = opts.name ?? dsecNameFor(src.refName) ?? `import-${src.configDigest.slice(7, 19)}`;
  if (!isImageName(name)) throw new ImportError(`invalid image name ${JSON.stringify(name)}`);
  progress(
    `importing ${src.refName ?? src.configDigest.slice(0, 19)} (${src.format}, ${src.layers.length} layers${opts.squash ? ', squashed' : ''}) as ${name}`,
  );
  const config = await imageConfigFor(src);
  const cache = readCache(store);
  const x = { store, scratch, cache, compression, progress, warn, onLayer: opts.onLayer };
  const layers = opts.squash ? await importSquashed(src, x) : await importEachLayer(src, x);
  const digests = [...new Set(layers.filter((l) => !l.empty && isLayerDigest(l.digest)).map((l) => l.digest))];
  if (digests.length === 0) throw new ImportError('the image has no content: every layer is empty');
  writeCache(store, cache, warn);
  await opts.beforeRecord?.(store.idOf({ layers: digests, config }));
  const id = store.put({ layers: digests, config });
  if (opts.tag !== false) store.tag(name, id);
  progress(`image ${name} imported: ${id.slice(0, 19)} (${digests.length} layer${digests.length === 1 ? '' : 's'})`);
  return {
    id,
    name,
    format: src.format,
    ...(src.refName ? { sourceRef: src.refName } : {}),
    squashed: opts.squash ?? false,
    layers,
    config,
    warnings,
  };
}

/** Errors of the archive itself become ImportError (a 400 for the API); others stay as they are. */
function asImportError(err: unknown): unknown {
  if (err instanceof TarFormatError || err instanceof UnsafeArchiveError || err instanceof CompressionError)
    return new ImportError(err.message);
  if (
    err instanceof Error &&
    /Z_DATA_ERROR|incorrect header check|unexpected end of file/i.test(`${(err as NodeJS.ErrnoException).code ?? ''} ${err.message}`)
  ) {
    return new ImportError(`a compressed stream in the archive is corrupt: ${err.message}`);
  }
  return err;
}

/** Imports an unpacked OCI image layout already on disk (a registry pull's scratch), using `scratch` for its work. */
export async function importLayoutDir(store: ImageStore, root: string, scratch: string, opts: ImportOptions = {}): Promise<ImportResult> {
  try {
    return await importFromDir(store, root, scratch, opts, []);
  } catch (err) {
    throw asImportError(err);
  }
}

async function importFromDir(
  store: ImageStore,
  root: string,
  scratch: string,
  opts: ImportOptions,
  warnings: string[],
): Promise<ImportResult> {
  let src: SourceImage;
  if (existsSync(join(root, 'index.json'))) src = await readOciLayout(root, opts);
  else if (existsSync(join(root, 'manifest.json'))) src = await readDockerSave(root, opts);
  else throw new ImportError('not an OCI image layout or a docker save archive: it has neither index.json nor manifest.json');
  return importSource(store, src, scratch, opts, warnings);
}

/** Imports from a tar stream of an OCI layout or a `docker save` archive (optionally gzip/zstd-compressed). */
export async function importImageArchive(
  store: ImageStore,
  source: AsyncIterable<Buffer>,
  opts: ImportOptions = {},
): Promise<ImportResult> {
  const scratch = mkdtempSync(join(store.layers.tmpDir, stagingPrefix('import')));
  const warnings: string[] = [];
  try {
    const archive = join(scratch, 'archive');
    mkdirSync(archive);
    opts.progress?.('unpacking the archive');
    await extractTarSafely(await decompressStream(source), archive, {
      layer: false,
      label: 'archive',
      warn: (m) => {
        warnings.push(m);
        opts.progress?.(`warning: ${m}`);
      },
    });
    return await importFromDir(store, archive, scratch, opts, warnings);
  } catch (err) {
    throw asImportError(err);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** Imports from a path: an OCI layout directory, or a tar (maybe compressed) of a layout or a `docker save`. */
export async function importImage(store: ImageStore, path: string, opts: ImportOptions = {}): Promise<ImportResult> {
  if (!existsSync(path)) throw new ImportError(`${path} does not exist`);
  if (!statSync(path).isDirectory()) return importImageArchive(store, createReadStream(path, { highWaterMark: 1 << 20 }), opts);
  const scratch = mkdtempSync(join(store.layers.tmpDir, stagingPrefix('import')));
  try {
    return await importFromDir(store, path, scratch, opts, []);
  } catch (err) {
    throw asImportError(err);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}
