/**
 * One control-plane replica in a process of its own (`dsec control` on a shared store, with the
 * busybox image built in its data dir), so a test can SIGKILL it mid-work. Arguments: a JSON
 * object {dataDir, store, layerDir?}. Prints one JSON line {url, apiKey, joinToken} once it serves.
 */
import { compileOptions } from '../../../src/config/options.js';
import { buildBusyboxImage } from '../../../src/image/builders/busybox.js';
import { startControlPlane } from '../../../src/runtime/all-in-one.js';

const { dataDir, store, layerDir } = JSON.parse(process.argv[2] ?? '{}') as { dataDir: string; store: string; layerDir?: string };
const control = await startControlPlane(compileOptions({ dataDir, store, layerDir, listen: '127.0.0.1:0', logLevel: 'warn' }, {}));
await buildBusyboxImage(control.images);
process.stdout.write(`${JSON.stringify({ url: control.url, apiKey: control.apiKey, joinToken: control.joinToken })}\n`);
process.once('SIGTERM', () => void control.close().then(() => process.exit(0)));
