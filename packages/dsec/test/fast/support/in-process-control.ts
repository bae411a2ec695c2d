/**
 * A control plane in process for the fast tier: a SIMULATED edge (it only records sandboxes), an
 * in-memory SQLite store, an image `busybox` of one placeholder layer, Fastify's inject() for
 * calls, and two projects (team-a, team-b) with a key each besides an admin key. No root, crun,
 * network or mkfs. (route-access.test.ts builds the same by hand, with its route walk around it.)
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pino } from 'pino';
import { SimulatedEdge } from '../../../src/edge/simulated/simulated-edge.js';
import { createApiKey } from '../../../src/control/api-keys.js';
import { ControlPlane } from '../../../src/control/control-plane.js';
import { PortLinks } from '../../../src/control/ports/port-links.js';
import { buildServer, type App } from '../../../src/control/server.js';
import { StateStore } from '../../../src/control/state-store.js';
import { defaultImageConfig, ImageStore } from '../../../src/image/image-store.js';
import { LayerStore } from '../../../src/image/layer-store.js';

/** What a call answers (Fastify's inject() response, the parts the tests read). */
export interface Injected {
  statusCode: number;
  body: string;
  json(): unknown;
}

export interface InProcessControl {
  app: App;
  control: ControlPlane;
  store: StateStore;
  keys: Record<'admin' | 'a' | 'b', string>;
  call(method: string, url: string, key?: string, body?: unknown): Promise<Injected>;
  close(): Promise<void>;
}

export async function startInProcessControl(): Promise<InProcessControl> {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-fast-'));
  const log = pino({ level: 'silent' });
  const store = await StateStore.open(':memory:');
  const layers = new LayerStore(join(dir, 'layers'));
  const images = new ImageStore(join(dir, 'images'), layers);
  const digest = await layers.addStream(Readable.from([Buffer.from('a placeholder layer: the simulated edge mounts nothing')]));
  images.tag('busybox', images.put({ layers: [digest], config: defaultImageConfig() }));
  const control = new ControlPlane(store, images, log);
  await control.edges.addLocal('fastone', new SimulatedEdge('fastone'));
  const app = await buildServer({
    control,
    store,
    images,
    log,
    clusterToken: 'dsecjoin_fast',
    links: new PortLinks('dsecjoin_fast'),
    portsOrigin: () => 'http://127.0.0.1:1',
    dataDir: dir,
  });
  const call = (method: string, url: string, key?: string, body?: unknown): Promise<Injected> =>
    app.inject({
      method: method as 'GET',
      url,
      headers: key ? { authorization: `Bearer ${key}` } : {},
      ...(body === undefined ? {} : { payload: body as object }),
    });
  const keys = { admin: (await createApiKey(store, 'admin', { admin: true })).key, a: '', b: '' };
  for (const p of ['team-a', 'team-b']) assert.equal((await call('POST', '/v1/projects', keys.admin, { name: p })).statusCode, 201);
  keys.a = (await createApiKey(store, 'a', { project: 'team-a' })).key;
  keys.b = (await createApiKey(store, 'b', { project: 'team-b' })).key;
  return {
    app,
    control,
    store,
    keys,
    call,
    async close() {
      await app.close();
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
