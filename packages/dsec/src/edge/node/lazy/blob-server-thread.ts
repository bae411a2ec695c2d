import { once } from 'node:events';
import { Worker } from 'node:worker_threads';

export interface BlobServerThreadOptions {
  /** The layer store's root (its blobs are in `<root>/layers`). */
  storeRoot: string;
  chunkSize: number;
  token?: string;
  /** Bytes per second across all responses; unset: unlimited. */
  rateBytesPerSec?: number;
  host?: string;
  port?: number;
}

export type BlobServerThreadRequest = { kind: 'stats' } | { kind: 'close' };
export type BlobServerThreadReply = { kind: 'listening'; url: string } | { kind: 'stats'; bytesServed: number; rangeRequests: number };

/**
 * A BlobServer on a worker thread of its own. A process that both serves blobs and reads lazy
 * layers needs it so: a read of a lazy layer blocks its caller in the kernel (a mount(2) reading
 * the superblock, a synchronous file read) until dsec-chunk-fuse has the chunk, and the chunk
 * would be served by that same, now blocked, event loop. `dsec up --layer-fetch lazy` (one
 * process: the store is local) and `dsec bench lazy` serve their blobs from here.
 */
export class BlobServerThread {
  private constructor(
    readonly url: string,
    private readonly worker: Worker,
  ) {}

  static async start(opts: BlobServerThreadOptions): Promise<BlobServerThread> {
    const worker = new Worker(new URL('./blob-server-worker.js', import.meta.url), { workerData: opts });
    const [first] = (await Promise.race([once(worker, 'message'), once(worker, 'error').then(([e]) => Promise.reject(e as Error))])) as [
      BlobServerThreadReply,
    ];
    if (first.kind !== 'listening') throw new Error('blob server thread: unexpected first message');
    worker.unref();
    return new BlobServerThread(first.url, worker);
  }

  async stats(): Promise<{ bytesServed: number; rangeRequests: number }> {
    this.worker.ref(); // an unref'd worker's reply would not keep the process waiting for it
    this.worker.postMessage({ kind: 'stats' } satisfies BlobServerThreadRequest);
    const [m] = (await once(this.worker, 'message')) as [BlobServerThreadReply];
    this.worker.unref();
    if (m.kind !== 'stats') throw new Error('blob server thread: unexpected reply');
    return m;
  }

  async close(): Promise<void> {
    this.worker.ref();
    const exited = once(this.worker, 'exit');
    this.worker.postMessage({ kind: 'close' } satisfies BlobServerThreadRequest);
    await exited;
  }
}
