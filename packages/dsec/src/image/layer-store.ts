import { createHash, randomBytes } from 'node:crypto';
import { closeSync, createReadStream, createWriteStream, existsSync, fsyncSync, mkdirSync, openSync, renameSync, rmSync, statSync, readdirSync } from 'node:fs';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { join } from 'node:path';

/** `sha256:<64 hex>`: the content address of an EROFS layer blob. */
export type LayerDigest = `sha256:${string}`;

const DIGEST = /^sha256:[0-9a-f]{64}$/;

export function isLayerDigest(s: string): s is LayerDigest {
  return DIGEST.test(s);
}

/**
 * Content-addressed store of EROFS layer blobs in a local directory (which may be a shared POSIX
 * mount such as NFS or CephFS). A blob's name is the sha256 of its bytes, so a blob is written
 * once, never changed, and safe to share between nodes.
 */
export class LayerStore {
  readonly dir: string;
  readonly tmpDir: string;

  constructor(root: string) {
    this.dir = join(root, 'layers');
    this.tmpDir = join(root, 'tmp');
    mkdirSync(this.dir, { recursive: true });
    mkdirSync(this.tmpDir, { recursive: true });
  }

  path(digest: LayerDigest): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.erofs`);
  }

  has(digest: LayerDigest): boolean {
    return existsSync(this.path(digest));
  }

  size(digest: LayerDigest): number {
    return statSync(this.path(digest)).size;
  }

  /** A fresh path in the store's filesystem to build a blob at before add(). */
  tempPath(suffix = '.erofs'): string {
    return join(this.tmpDir, `blob-${randomBytes(6).toString('hex')}${suffix}`);
  }

  /** Moves a finished blob into the store under its digest; an identical blob is kept once. */
  async add(file: string): Promise<LayerDigest> {
    const digest = await sha256File(file);
    const dest = this.path(digest);
    if (existsSync(dest)) rmSync(file, { force: true });
    else renameSync(file, dest);
    return digest;
  }

  /**
   * Writes a stream into the store: hashed while it is written, fsynced, then renamed under its
   * digest (an identical blob is kept once). Returns the digest the bytes have.
   */
  async addStream(body: NodeJS.ReadableStream): Promise<LayerDigest> {
    const tmp = this.tempPath();
    const hash = createHash('sha256');
    try {
      const out = createWriteStream(tmp, { mode: 0o644 });
      await pipeline(body, new Transform({ transform(chunk: Buffer, _e, cb) { hash.update(chunk); cb(null, chunk); } }), out);
      const fd = openSync(tmp, 'r');
      try {
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      const digest: LayerDigest = `sha256:${hash.digest('hex')}`;
      if (existsSync(this.path(digest))) rmSync(tmp, { force: true });
      else renameSync(tmp, this.path(digest));
      return digest;
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
  }

  /** Removes a blob; callers make sure nothing references it. */
  remove(digest: LayerDigest): number {
    const p = this.path(digest);
    try {
      const size = statSync(p).size;
      rmSync(p);
      return size;
    } catch {
      return 0;
    }
  }

  /** How long ago the blob was written, in ms. */
  ageMs(digest: LayerDigest): number {
    return Date.now() - statSync(this.path(digest)).mtimeMs;
  }

  list(): LayerDigest[] {
    return readdirSync(this.dir)
      .filter((f) => f.endsWith('.erofs'))
      .map((f) => `sha256:${f.slice(0, -'.erofs'.length)}` as LayerDigest);
  }
}

export async function sha256File(file: string): Promise<LayerDigest> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return `sha256:${hash.digest('hex')}`;
}
