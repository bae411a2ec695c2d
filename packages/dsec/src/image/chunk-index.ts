import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';

/**
 * 256 KiB: a chunk is the unit a lazy node fetches, verifies and caches. Chosen by measurement
 * (`dsec bench lazy --chunk-kib`, bench/results/lazy-29/): on a 305 MiB Debian image python3, git
 * and gcc read 6.5, 3.4 and 13.1 % of it at 256 KiB against 14.1, 7.5 and 22.3 % at 1 MiB (DSec's
 * and Nydus's size), because a 1 MiB chunk brings in the neighbours of every small file read; the
 * four times as many requests cost less than the bytes saved on a 1 Gbit/s link.
 */
export const DEFAULT_CHUNK_SIZE = 256 << 10;

/**
 * A layer blob's per-chunk sha256 list: chunk i covers bytes [i*chunkSize, min(size, (i+1)*chunkSize)).
 * Recorded when the layer is made, so a lazy node can trust each chunk on arrival, before the
 * whole blob (whose own digest covers only all of it) has been read.
 */
export interface ChunkIndex {
  chunkSize: number;
  size: number;
  /** `sha256:<hex>` of each chunk, in order. */
  digests: string[];
}

/** Reads the file once, hashing each chunk. */
export async function computeChunkIndex(file: string, chunkSize = DEFAULT_CHUNK_SIZE): Promise<ChunkIndex> {
  const fh = await open(file, 'r');
  try {
    const { size } = await fh.stat();
    const digests: string[] = [];
    const buf = Buffer.allocUnsafe(Math.min(chunkSize, Math.max(size, 1)));
    for (let off = 0; off < size; off += chunkSize) {
      const len = Math.min(chunkSize, size - off);
      const hash = createHash('sha256');
      let done = 0;
      while (done < len) {
        const want = Math.min(buf.length, len - done);
        const { bytesRead } = await fh.read(buf, 0, want, off + done);
        if (bytesRead === 0) throw new Error(`${file} shrank while its chunks were hashed`);
        hash.update(buf.subarray(0, bytesRead));
        done += bytesRead;
      }
      digests.push(`sha256:${hash.digest('hex')}`);
    }
    return { chunkSize, size, digests };
  } finally {
    await fh.close();
  }
}

/** Whether `v` is a well-formed index (what an edge checks before it trusts one from the network). */
export function isChunkIndex(v: unknown): v is ChunkIndex {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  if (!Number.isSafeInteger(o['chunkSize']) || (o['chunkSize'] as number) < 4096 || (o['chunkSize'] as number) > 1 << 30) return false;
  if (!Number.isSafeInteger(o['size']) || (o['size'] as number) < 0) return false;
  const n = Math.ceil((o['size'] as number) / (o['chunkSize'] as number));
  return (
    Array.isArray(o['digests']) &&
    o['digests'].length === n &&
    o['digests'].every((d) => typeof d === 'string' && /^sha256:[0-9a-f]{64}$/.test(d))
  );
}
