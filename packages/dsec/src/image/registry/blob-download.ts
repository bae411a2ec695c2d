import { createWriteStream, statSync } from 'node:fs';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { sha256File } from '../layer-store.js';
import type { Descriptor } from './dsec-artifact.js';
import type { PullOptions } from './pull-types.js';
import { RegistryError, describeFetchError, type RegistryClient } from './registry-client.js';

/**
 * Downloads a blob into `file` and checks its size and digest. When the connection breaks the
 * download goes on from the bytes the file has, with a Range request (up to `maxResumes` times).
 */
export async function downloadBlob(
  client: RegistryClient,
  blob: Descriptor,
  file: string,
  opts: Pick<PullOptions, 'onBytes' | 'progress'> & { maxResumes: number },
): Promise<{ resumes: number }> {
  let resumes = 0;
  for (;;) {
    const have = sizeOf(file);
    if (have >= blob.size) break;
    try {
      const { body } = await client.getBlob(blob.digest, have > 0 ? { start: have } : undefined);
      let received = have;
      const count = new Transform({
        transform(chunk: Buffer, _e, cb) {
          received += chunk.length;
          opts.onBytes?.(blob.digest, received, blob.size);
          cb(null, chunk);
        },
      });
      const out = createWriteStream(file, { flags: 'a', mode: 0o644 });
      // The size of the file decides where the next attempt starts: every write of this one must
      // have landed first (a write still in flight after a broken pipeline would duplicate bytes).
      const closed = new Promise<void>((r) => out.once('close', () => r()));
      try {
        await pipeline(body, count, out);
      } finally {
        out.destroy();
        await closed;
      }
      if (sizeOf(file) >= blob.size) break;
    } catch (err) {
      if (err instanceof RegistryError) throw err; // the client retried already, or it is not worth retrying
      if (resumes >= opts.maxResumes)
        throw new RegistryError(
          `registry ${client.ref.host}: the download of blob ${blob.digest} broke off ${resumes + 1} times (${describeFetchError(err)})`,
        );
    }
    // The body ended early or broke off: go on from what arrived.
    resumes++;
    opts.progress?.(`blob ${blob.digest.slice(7, 19)}: the download broke off at ${sizeOf(file)} of ${blob.size} bytes; resuming`);
  }
  if (sizeOf(file) !== blob.size)
    throw new RegistryError(`registry ${client.ref.host}: blob ${blob.digest} is ${sizeOf(file)} bytes, the manifest says ${blob.size}`);
  const got = await sha256File(file);
  if (got !== blob.digest)
    throw new RegistryError(
      `registry ${client.ref.host}: blob ${blob.digest} arrived with other bytes (they hash to ${got}); nothing was stored`,
    );
  return { resumes };
}

function sizeOf(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}
