import { parentPort, workerData } from 'node:worker_threads';
import { LayerStore } from '../../../image/layer-store.js';
import { BlobServer } from './blob-server.js';
import type { BlobServerThreadOptions, BlobServerThreadReply, BlobServerThreadRequest } from './blob-server-thread.js';

/** The body of BlobServerThread: a BlobServer on its own event loop, driven by messages. */
const opts = workerData as BlobServerThreadOptions;
const server = new BlobServer({
  store: new LayerStore(opts.storeRoot, { chunkSize: opts.chunkSize }),
  ...(opts.token ? { token: opts.token } : {}),
  ...(opts.rateBytesPerSec ? { rateBytesPerSec: opts.rateBytesPerSec } : {}),
  ...(opts.host ? { host: opts.host } : {}),
});
const url = await server.listen(opts.port ?? 0);
const port = parentPort!;
port.postMessage({ kind: 'listening', url } satisfies BlobServerThreadReply);
port.on('message', (m: BlobServerThreadRequest) => {
  if (m.kind === 'stats')
    port.postMessage({
      kind: 'stats',
      bytesServed: server.bytesServed,
      rangeRequests: server.rangeRequests,
    } satisfies BlobServerThreadReply);
  else if (m.kind === 'close') void server.close().then(() => port.close());
});
