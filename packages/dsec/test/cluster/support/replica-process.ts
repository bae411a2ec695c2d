/**
 * One control-plane replica in a process of its own (`dsec control` on a shared store, with the
 * busybox image built in its data dir), so a test can SIGKILL it mid-work. Arguments: a JSON
 * object {dataDir, store, layerDir?, registry?}. Prints one JSON line {url, apiKey, joinToken} once it serves.
 */
import { compileOptions } from '../../../src/config/options.js';
import { buildBusyboxImage } from '../../../src/image/builders/busybox.js';
import { startControlPlane } from '../../../src/runtime/all-in-one.js';

const { dataDir, store, layerDir, registry } = JSON.parse(process.argv[2] ?? '{}') as {
  dataDir: string;
  store: string;
  layerDir?: string;
  registry?: string;
};
const control = await startControlPlane(
  compileOptions({ dataDir, store, layerDir, registry, listen: '127.0.0.1:0', logLevel: 'warn' }, {}),
);
await buildBusyboxImage(control.images);
await control.images.flush(); // in the store (and the registry, with one) before anyone is told
process.stdout.write(`${JSON.stringify({ url: control.url, apiKey: control.apiKey, joinToken: control.joinToken })}\n`);
process.once('SIGTERM', () => void control.close().then(() => process.exit(0)));
