import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { ImageStore } from '../image/image-store.js';
import { LayerStore } from '../image/layer-store.js';
import { ControlPlane } from './control-plane.js';
import { PortLinks } from './ports/port-links.js';
import { buildServer } from './server.js';
import { StateStore } from './state-store.js';

/**
 * The OpenAPI document, generated from the same route schemas the server validates with. Built
 * on a throw-away server (in-memory SQLite, empty image store) so it needs no root and no host.
 */
export async function generateOpenApi(): Promise<unknown> {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-openapi-'));
  const log = pino({ level: 'silent' });
  const store = await StateStore.open(':memory:');
  try {
    const images = new ImageStore(dir, new LayerStore(dir));
    const control = new ControlPlane(store, images, log);
    const app = await buildServer({
      control,
      store,
      images,
      log,
      clusterToken: 'openapi',
      links: new PortLinks('openapi'),
      portsOrigin: () => 'http://ports.invalid',
      dataDir: dir,
    });
    const doc = app.swagger();
    await app.close();
    return doc;
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
