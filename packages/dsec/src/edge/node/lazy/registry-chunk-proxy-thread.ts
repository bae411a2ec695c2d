import { once } from 'node:events';
import { Worker } from 'node:worker_threads';
import type { RegistryCredentials } from '../../../image/registry/registry-auth.js';
import type { RegistryRef } from '../../../image/registry/registry-ref.js';

export interface RegistryChunkProxyThreadOptions {
  registry: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>;
  credentials: RegistryCredentials | undefined;
  fallbackUrl: string;
  fallbackToken: string;
  token: string;
}

export type RegistryChunkProxyThreadRequest = { kind: 'stats' } | { kind: 'close' };
export type RegistryChunkProxyThreadReply =
  { kind: 'listening'; url: string } | { kind: 'stats'; registryRanges: number; fallback: number };

/**
 * A RegistryChunkProxy on a worker thread of its own, for the reason BlobServerThread gives: a
 * lazy layer read blocks its caller in the kernel until dsec-chunk-fuse has the chunk, and the
 * edge's own event loop may be that caller (a mount reading the superblock).
 */
export class RegistryChunkProxyThread {
  private constructor(
    readonly url: string,
    private readonly worker: Worker,
  ) {}

  static async start(opts: RegistryChunkProxyThreadOptions): Promise<RegistryChunkProxyThread> {
    const worker = new Worker(new URL('./registry-chunk-proxy-worker.js', import.meta.url), { workerData: opts });
    const [first] = (await Promise.race([once(worker, 'message'), once(worker, 'error').then(([e]) => Promise.reject(e as Error))])) as [
      RegistryChunkProxyThreadReply,
    ];
    if (first.kind !== 'listening') throw new Error('registry chunk proxy thread: unexpected first message');
    worker.unref();
    return new RegistryChunkProxyThread(first.url, worker);
  }

  async stats(): Promise<{ registryRanges: number; fallback: number }> {
    this.worker.ref();
    this.worker.postMessage({ kind: 'stats' } satisfies RegistryChunkProxyThreadRequest);
    const [m] = (await once(this.worker, 'message')) as [RegistryChunkProxyThreadReply];
    this.worker.unref();
    if (m.kind !== 'stats') throw new Error('registry chunk proxy thread: unexpected reply');
    return m;
  }

  async close(): Promise<void> {
    this.worker.ref();
    const exited = once(this.worker, 'exit');
    this.worker.postMessage({ kind: 'close' } satisfies RegistryChunkProxyThreadRequest);
    await exited;
  }
}
