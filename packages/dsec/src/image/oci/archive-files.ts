import { existsSync, realpathSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { sha256File } from '../layer-store.js';
import { type Descriptor, ImportError } from './import-types.js';
import { cleanArchivePath } from './safe-extract.js';

// Reading an unpacked archive's files as untrusted input: paths kept inside it, JSON and digests
// checked, blobs verified against their descriptors.

/** `rel` inside `root`, symlinks resolved, refusing anything that lands outside the root. */
export function resolveIn(root: string, rel: string): string {
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

export function parseJson<T>(text: string, what: string): T {
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new ImportError(`${what} is not valid JSON: ${(err as Error).message}`);
  }
}

export function checkDigest(d: string, what: string): string {
  if (!/^sha256:[0-9a-f]{64}$/.test(d))
    throw new ImportError(`${what} has an unsupported or malformed digest ${JSON.stringify(d)} (only sha256 is supported)`);
  return d;
}

/** A blob's path after checking its bytes against the digest (and size) the descriptor gives. */
export async function verifiedBlob(root: string, desc: Descriptor, what: string): Promise<string> {
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
