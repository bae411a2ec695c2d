import { parentPort, workerData } from 'node:worker_threads';
import { RegistryClient } from '../../../image/registry/registry-client.js';
import { RegistryChunkProxy } from './registry-chunk-proxy.js';
import type {
  RegistryChunkProxyThreadOptions,
  RegistryChunkProxyThreadReply,
  RegistryChunkProxyThreadRequest,
} from './registry-chunk-proxy-thread.js';

/** The body of RegistryChunkProxyThread: the proxy on its own event loop, driven by messages. */
const opts = workerData as RegistryChunkProxyThreadOptions;
const proxy = new RegistryChunkProxy({
  registry: new RegistryClient(opts.registry, { credentials: opts.credentials, attempts: 3 }),
  fallbackUrl: opts.fallbackUrl,
  fallbackToken: opts.fallbackToken,
  token: opts.token,
});
const url = await proxy.listen();
const port = parentPort!;
port.postMessage({ kind: 'listening', url } satisfies RegistryChunkProxyThreadReply);
port.on('message', (m: RegistryChunkProxyThreadRequest) => {
  if (m.kind === 'stats') port.postMessage({ kind: 'stats', ...proxy.counts } satisfies RegistryChunkProxyThreadReply);
  else if (m.kind === 'close') void proxy.close().then(() => port.close());
});
