import { createHash } from 'node:crypto';
import { createReadStream, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import { writeFileAtomic } from './atomic-file.js';
import { buildErofs, type ErofsBuildOptions } from './erofs.js';
import { type ImageId, type ImageStore, isImageName } from './image-store.js';
import { type LayerDigest, isLayerDigest, sha256File } from './layer-store.js';
import { CompressionError, decompressStream, openDecompressed, sniffFile } from './oci/decompress.js';
import { mergeLayerInto } from './oci/merge.js';
import {
  OPAQUE_MARKER,
  UnsafeArchiveError,
  WHITEOUT_PREFIX,
  cleanArchivePath,
  extractTarSafely,
  type ExtractStats,
} from './oci/safe-extract.js';
import { TarFormatError, readTar } from './oci/tar-reader.js';
import { stagingPrefix } from './staging.js';

/**
 * Imports container images made elsewhere: an OCI image layout (a directory, or a tar of one) or
 * a `docker save` archive (the legacy manifest.json form and the OCI index.json form of Docker
 * 25+). Every blob is checked against its sha256 digest, every layer against the config's
 * diff_id; each layer is unpacked safely (see oci/safe-extract.ts) with OCI whiteouts turned
 * into overlayfs ones, and becomes one EROFS layer (or all of them one, with `squash`). The
 * image config (Env, WorkingDir, User, Entrypoint, Cmd, Labels) becomes dsec's ImageConfig.
 */

export interface ImportOptions {
  /** Tag the image with this name; default: the name the archive gives it. */
  name?: string;
  /** Merge every layer into one EROFS layer (whiteouts applied as deletions). */
  squash?: boolean;
  /** Which image, when the archive holds several: a name it is tagged with in the archive. */
  ref?: string;
  progress?: (message: string) => void;
  /** Called as each layer is taken up: its index (0-based), the number of layers (for a progress bar). */
  onLayer?: (index: number, total: number) => void;
  /** @default 'lz4' */
  compression?: ErofsBuildOptions['compression'];
}

export type ImportFormat = 'oci-layout' | 'docker-save';

export interface ImportedLayer {
  /** sha256 of the uncompressed layer tar, as the image config lists it. */
  diffId: string;
  /** The EROFS layer it became (for a squashed import: the one layer, on every entry). */
  digest: LayerDigest;
  /** Reused from an earlier import of the same layer: nothing was unpacked. */
  cached: boolean;
  /** An empty layer (no entries): it adds nothing and is left out of the image. */
  empty: boolean;
  entries: number;
  bytes: number;
  whiteouts: number;
  opaqueDirs: number;
}

export interface ImportResult {
  id: ImageId;
  name: string;
  format: ImportFormat;
  /** The name the archive gave the image, if any. */
  sourceRef?: string;
  squashed: boolean;
  layers: ImportedLayer[];
  config: ImageConfig;
  warnings: string[];
}

/** The archive is not one dsec can import (malformed, unsafe, wrong digest…): the caller's fault. */
export class ImportError extends Error {
  override readonly name = 'ImportError';
}

const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const IMPORT_CACHE_VERSION = 1;

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const MANIFEST_TYPES = new Set(['application/vnd.oci.image.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v2+json']);
const LAYER_TYPE =
  /^application\/vnd\.(oci\.image\.layer(\.nondistributable)?\.v1\.tar|docker\.image\.rootfs(\.foreign)?\.diff\.tar)(\.gzip|\+gzip|\+zstd|\.zstd)?$/;

interface Descriptor {
  mediaType?: string;
  digest: string;
  size?: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

interface OciImageConfig {
  architecture?: string;
  os?: string;
  config?: {
    Env?: string[] | null;
    WorkingDir?: string;
    User?: string;
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    Labels?: Record<string, string> | null;
  } | null;
  rootfs?: { type?: string; diff_ids?: string[] };
}

/** One image found in a layout or archive, verified up to its layer blobs. */
interface SourceImage {
  format: ImportFormat;
  refName?: string;
  manifestDigest?: string;
  configDigest: string;
  config: OciImageConfig;
  layers: { file: string; diffId: string; label: string }[];
}

// --- reading a layout ------------------------------------------------------------------------

/** `rel` inside `root`, symlinks resolved, refusing anything that lands outside the root. */
function resolveIn(root: string, rel: string): string {
  const clean = cleanArchivePath(rel);
  if (clean === undefined || clean === '') throw new ImportError(`the archive refers to ${JSON.stringify(rel)}, which is outside it`);
  const p = join(root, clean);
  if (!existsSync(p)) throw new ImportError(`the archive refers to ${clean}, which it does not contain`);
  const real = realpathSync(p);
  const realRoot = realpathSync(root);
  if (real !== realRoot && !real.startsWith(`${realRoot}/`)) throw new ImportError(`${clean} is a symlink that leads outside the archive`);
  if (!statSync(real).isFile()) throw new ImportError(`${clean} is not a regular file`);
  return real;
}

function parseJson<T>(text: string, what: string): T {
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new ImportError(`${what} is not valid JSON: ${(err as Error).message}`);
  }
}

function checkDigest(d: string, what: string): string {
  if (!/^sha256:[0-9a-f]{64}$/.test(d))
    throw new ImportError(`${what} has an unsupported or malformed digest ${JSON.stringify(d)} (only sha256 is supported)`);
  return d;
}

/** A blob's path after checking its bytes against the digest (and size) the descriptor gives. */
async function verifiedBlob(root: string, desc: Descriptor, what: string): Promise<string> {
  const digest = checkDigest(desc.digest, what);
  const file = resolveIn(root, `blobs/sha256/${digest.slice(7)}`);
  const size = statSync(file).size;
  if (desc.size !== undefined && desc.size !== size) {
    throw new ImportError(`digest mismatch: ${what} ${digest} should be ${desc.size} bytes but the blob has ${size}`);
  }
  const actual = await sha256File(file);
  if (actual !== digest) throw new ImportError(`digest mismatch: ${what} should have sha256 ${digest} but the blob has ${actual}`);
  return file;
}

function hostArchitecture(): string {
  const map: Record<string, string> = {
    x64: 'amd64',
    arm64: 'arm64',
    arm: 'arm',
    ia32: '386',
    ppc64: 'ppc64le',
    s390x: 's390x',
    riscv64: 'riscv64',
  };
  return map[process.arch] ?? process.arch;
}

/** `docker.io/library/busybox:1.36` → `busybox:1.36`; a name dsec accepts, or undefined. */
export function dsecNameFor(ref: string | undefined): string | undefined {
  if (!ref) return undefined;
  let r = ref.split('@')[0]!;
  const slash = r.lastIndexOf('/');
  if (slash >= 0) r = r.slice(slash + 1);
  r = r.toLowerCase().replace(/[^a-z0-9._:-]/g, '-');
  if (r.split(':').length > 2) return undefined;
  return isImageName(r) ? r : undefined;
}

function refMatches(candidate: string | undefined, wanted: string): boolean {
  if (!candidate) return false;
  const norm = (s: string): string => (s.includes(':') ? s : `${s}:latest`);
  return (
    candidate === wanted || norm(candidate) === norm(wanted) || dsecNameFor(candidate) === norm(wanted) || dsecNameFor(candidate) === wanted
  );
}

async function readOciLayout(root: string, opts: ImportOptions): Promise<SourceImage> {
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

async function readDockerSave(root: string, opts: ImportOptions): Promise<SourceImage> {
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

// --- config ------------------------------------------------------------------------------------

/** Reads /etc/passwd and /etc/group of the merged image from its layer tars, top layer first. */
async function etcFiles(layers: SourceImage['layers']): Promise<{ passwd?: string; group?: string }> {
  const wanted = ['etc/passwd', 'etc/group'] as const;
  const out: Record<string, string | null | undefined> = {};
  for (const layer of [...layers].reverse()) {
    const deleted = new Set<string>();
    for await (const { header, body } of readTar(openDecompressed(layer.file))) {
      const rel = cleanArchivePath(header.name);
      if (rel === undefined) continue;
      const base = rel.slice(rel.lastIndexOf('/') + 1);
      const parent = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : '';
      if (base === OPAQUE_MARKER) deleted.add(`${parent}/*`);
      else if (base.startsWith(WHITEOUT_PREFIX)) deleted.add(parent ? `${parent}/${base.slice(4)}` : base.slice(4));
      else if ((wanted as readonly string[]).includes(rel) && header.type === 'file' && out[rel] === undefined && header.size <= 4 << 20) {
        const chunks: Buffer[] = [];
        for await (const c of body) chunks.push(c);
        out[rel] = Buffer.concat(chunks).toString('utf8');
      }
    }
    for (const w of wanted) {
      if (out[w] === undefined && (deleted.has(w) || deleted.has('etc') || deleted.has('etc/*'))) out[w] = null;
    }
    if (wanted.every((w) => out[w] !== undefined)) break;
  }
  return { passwd: out['etc/passwd'] ?? undefined, group: out['etc/group'] ?? undefined };
}

/** An image's User as dsec's numeric `uid[:gid]`; names looked up in the image's own files. */
async function resolveUser(spec: string, layers: SourceImage['layers']): Promise<string> {
  const s = spec.trim();
  if (s === '') return '0:0';
  if (/^\d+(:\d+)?$/.test(s)) return s;
  const [userPart, groupPart] = s.split(':', 2) as [string, string | undefined];
  const etc = await etcFiles(layers);
  const lookup = (file: string | undefined, name: string): string[] | undefined =>
    file
      ?.split('\n')
      .map((l) => l.split(':'))
      .find((f) => f[0] === name && f.length >= 3);
  let uid: string;
  let gid: string | undefined;
  if (/^\d+$/.test(userPart)) uid = userPart;
  else {
    if (etc.passwd === undefined)
      throw new ImportError(
        `the image's User is ${JSON.stringify(spec)}, a name, but the image has no /etc/passwd to resolve it; use a numeric uid[:gid]`,
      );
    const f = lookup(etc.passwd, userPart);
    if (!f || !/^\d+$/.test(f[2] ?? ''))
      throw new ImportError(`the image's User ${JSON.stringify(spec)} names a user that is not in the image's /etc/passwd`);
    uid = f[2]!;
    gid = /^\d+$/.test(f[3] ?? '') ? f[3] : undefined;
  }
  if (groupPart !== undefined && groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = groupPart;
    else {
      const f = lookup(etc.group, groupPart);
      if (!f || !/^\d+$/.test(f[2] ?? ''))
        throw new ImportError(`the image's User ${JSON.stringify(spec)} names a group that is not in the image's /etc/group`);
      gid = f[2];
    }
  }
  return gid === undefined ? uid : `${uid}:${gid}`;
}

async function imageConfigFor(src: SourceImage): Promise<ImageConfig> {
  const c = src.config.config ?? {};
  const user = await resolveUser(c.User ?? '', src.layers);
  const env = (c.Env ?? []).filter((e): e is string => typeof e === 'string' && e.includes('='));
  if (!env.some((e) => e.startsWith('PATH='))) env.unshift(DEFAULT_PATH);
  if (!env.some((e) => e.startsWith('HOME=')) && /^0(:|$)/.test(user)) env.push('HOME=/root');
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(c.Labels ?? {})) if (typeof v === 'string') labels[k] = v;
  labels['dsec.import.format'] = src.format;
  labels['dsec.import.config'] = src.configDigest;
  if (src.refName) labels['dsec.import.ref'] = src.refName;
  const wd = c.WorkingDir?.trim();
  return {
    env,
    cwd: wd ? (wd.startsWith('/') ? wd : `/${wd}`) : '/',
    user,
    entrypoint: (c.Entrypoint ?? []).filter((x) => typeof x === 'string'),
    cmd: (c.Cmd ?? []).filter((x) => typeof x === 'string'),
    labels,
  };
}

// --- layers ------------------------------------------------------------------------------------

interface ImportCache {
  version: number;
  layers: Record<string, LayerDigest>;
}

function cachePath(store: ImageStore): string {
  return join(store.dir, 'import-cache.json');
}

function readCache(store: ImageStore): ImportCache {
  try {
    const c = JSON.parse(readFileSync(cachePath(store), 'utf8')) as ImportCache;
    if (c.version === IMPORT_CACHE_VERSION && c.layers && typeof c.layers === 'object') return c;
  } catch {
    // missing or unreadable: start over
  }
  return { version: IMPORT_CACHE_VERSION, layers: {} };
}

function cacheKey(kind: string, diffIds: string[], compression: string): string {
  return createHash('sha256')
    .update(JSON.stringify([IMPORT_CACHE_VERSION, kind, compression, diffIds]))
    .digest('hex');
}

/** Unpacks one layer blob into `tree` (overlay form) and checks its uncompressed digest. */
async function unpackLayer(layer: SourceImage['layers'][number], tree: string, warn: (m: string) => void): Promise<ExtractStats> {
  mkdirSync(tree, { recursive: true });
  const hash = createHash('sha256');
  const tap = async function* (): AsyncGenerator<Buffer> {
    for await (const chunk of openDecompressed(layer.file)) {
      hash.update(chunk);
      yield chunk;
    }
  };
  const stats = await extractTarSafely(tap(), tree, { layer: true, warn, label: layer.label });
  const actual = `sha256:${hash.digest('hex')}`;
  if (actual !== layer.diffId)
    throw new ImportError(`digest mismatch: ${layer.label} unpacks to sha256 ${actual} but the image config says ${layer.diffId}`);
  return stats;
}

function isEmpty(s: ExtractStats): boolean {
  return s.entries === 0 && s.whiteouts === 0 && s.opaqueDirs === 0;
}

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
  const layers: ImportedLayer[] = [];
  const zero = { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0 };

  if (opts.squash) {
    const key = cacheKey(
      'squash',
      src.layers.map((l) => l.diffId),
      compression,
    );
    let digest = cache.layers[key];
    const cached = digest !== undefined && store.layers.has(digest);
    const totals = { ...zero };
    if (!cached) {
      const tree = join(scratch, 'squash');
      mkdirSync(tree);
      for (const [i, l] of src.layers.entries()) {
        opts.onLayer?.(i, src.layers.length);
        progress(`  unpacking ${l.label} (${i + 1}/${src.layers.length})`);
        const layerTree = join(scratch, `layer-${i}`);
        const s = await unpackLayer(l, layerTree, warn);
        totals.entries += s.entries;
        totals.bytes += s.bytes;
        mergeLayerInto(tree, layerTree);
        rmSync(layerTree, { recursive: true, force: true });
      }
      progress('  packing the squashed tree with mkfs.erofs');
      const blob = store.layers.tempPath();
      await buildErofs(tree, blob, { compression });
      digest = await store.layers.add(blob);
      cache.layers[key] = digest;
    } else progress(`  reusing squashed layer ${digest!.slice(0, 19)} from an earlier import`);
    for (const l of src.layers) layers.push({ diffId: l.diffId, digest: digest!, cached, empty: false, ...totals });
  } else {
    for (const [i, l] of src.layers.entries()) {
      opts.onLayer?.(i, src.layers.length);
      const key = cacheKey('layer', [l.diffId], compression);
      const known = cache.layers[key];
      if (known && store.layers.has(known)) {
        progress(`  ${l.label}: already imported as ${known.slice(0, 19)}`);
        layers.push({ diffId: l.diffId, digest: known, cached: true, empty: false, ...zero });
        continue;
      }
      progress(`  unpacking ${l.label} (${i + 1}/${src.layers.length})`);
      const tree = join(scratch, `layer-${i}`);
      const s = await unpackLayer(l, tree, warn);
      if (isEmpty(s)) {
        rmSync(tree, { recursive: true, force: true });
        layers.push({ diffId: l.diffId, digest: '' as LayerDigest, cached: false, empty: true, ...zero });
        continue;
      }
      const blob = store.layers.tempPath();
      await buildErofs(tree, blob, { compression });
      rmSync(tree, { recursive: true, force: true });
      const digest = await store.layers.add(blob);
      cache.layers[key] = digest;
      layers.push({
        diffId: l.diffId,
        digest,
        cached: false,
        empty: false,
        entries: s.entries,
        bytes: s.bytes,
        whiteouts: s.whiteouts,
        opaqueDirs: s.opaqueDirs,
      });
    }
  }
  const digests = [...new Set(layers.filter((l) => !l.empty && isLayerDigest(l.digest)).map((l) => l.digest))];
  if (digests.length === 0) throw new ImportError('the image has no content: every layer is empty');
  try {
    writeFileAtomic(cachePath(store), JSON.stringify(cache, null, 2));
  } catch (err) {
    warn(`could not update the import cache: ${(err as Error).message}`);
  }
  const id = store.put({ layers: digests, config });
  store.tag(name, id);
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
