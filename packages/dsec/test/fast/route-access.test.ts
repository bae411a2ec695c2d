/**
 * The fast tier: every route of the control plane's API, in process (Fastify's inject()), with a
 * SIMULATED edge (it only records sandboxes), an in-memory SQLite store and an image of one
 * placeholder layer. No root, no crun, no network, no mkfs: it runs on any machine with Node.
 * Each route is called with no key, a wrong key, another project's key, the project's own key
 * and an admin key, and each answer is held to what the route's access declaration promises.
 * (The same walk over real sockets, with absolute-form targets and the edge protocol, is
 * test/security/front-door.test.ts.)
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { SimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { createApiKey } from '../../src/control/api-keys.js';
import { ControlPlane } from '../../src/control/control-plane.js';
import { PortLinks } from '../../src/control/ports/port-links.js';
import { buildServer, type App } from '../../src/control/server.js';
import { StateStore } from '../../src/control/state-store.js';
import { declaredRoutes, type Access } from '../../src/http/access.js';
import { defaultImageConfig, ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { bodyOf, pathOf } from './support/route-walk.js';

type Route = { method: string; url: string; access: Access | undefined };

describe('fast tier: the access matrix of every route, in process', () => {
  let dir: string;
  let store: StateStore;
  let control: ControlPlane;
  let app: App;
  let routes: Route[];
  const keys: Record<'admin' | 'a' | 'b', string> = { admin: '', a: '', b: '' };
  let sandbox: SandboxInfo;
  let values: Record<string, string>;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-fast-'));
    const log = pino({ level: 'silent' });
    store = await StateStore.open(':memory:');
    const layers = new LayerStore(join(dir, 'layers'));
    const images = new ImageStore(join(dir, 'images'), layers);
    const digest = await layers.addStream(Readable.from([Buffer.from('a placeholder layer: the simulated edge mounts nothing')]));
    images.tag('busybox', images.put({ layers: [digest], config: defaultImageConfig() }));
    control = new ControlPlane(store, images, log);
    await control.edges.addLocal('fastone', new SimulatedEdge('fastone'));
    app = await buildServer({
      control,
      store,
      images,
      log,
      clusterToken: 'dsecjoin_fast',
      links: new PortLinks('dsecjoin_fast'),
      portsOrigin: () => 'http://127.0.0.1:1',
      dataDir: dir,
    });
    keys.admin = (await createApiKey(store, 'admin', { admin: true })).key;
    for (const p of ['team-a', 'team-b']) assert.equal((await call('POST', '/v1/projects', keys.admin, { name: p })).statusCode, 201);
    keys.a = (await createApiKey(store, 'a', { project: 'team-a' })).key;
    keys.b = (await createApiKey(store, 'b', { project: 'team-b' })).key;
    const made = await call('POST', '/v1/sandboxes', keys.a, { image: 'busybox', resources: { memoryMiB: 64 } });
    assert.equal(made.statusCode, 201, made.body);
    sandbox = made.json() as SandboxInfo;
    values = {
      id: sandbox.id,
      port: '8000',
      pid: '1',
      sid: 'ses_x',
      digest,
      name: 'nosuch',
      ref: 'busybox',
      service: 'process.Process',
      method: 'List',
    };
    routes = declaredRoutes(app).filter((r) => r.method !== 'HEAD' && !r.url.startsWith('/e2b-sandbox'));
  });
  after(async () => {
    await app?.close();
    await store?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const call = (method: string, url: string, key?: string, body?: unknown) =>
    app.inject({
      method: method as 'GET',
      url,
      headers: key ? { authorization: `Bearer ${key}` } : {},
      ...(body === undefined ? {} : { payload: body as object }),
    });
  const pathFor = (r: Route): string => pathOf(r.url, values);
  /** Every route but those whose handler ends or changes something the walk still needs. */
  const walkable = (r: Route): boolean =>
    !(r.method === 'DELETE' && r.url === '/v1/sandboxes/:id') && !/\/(kill|pause|resume|snapshot|fork|replay)$/.test(r.url);

  test('every route declares its access; the walk covers the whole API', () => {
    assert.ok(routes.length > 60, `${routes.length} routes`);
    assert.deepEqual(
      routes.filter((r) => !r.access).map((r) => `${r.method} ${r.url}`),
      [],
    );
  });

  test('no key and a wrong key: every route that takes credentials answers 401, never runs', async () => {
    const wrong: string[] = [];
    for (const r of routes) {
      if (r.access?.kind === 'public') continue;
      for (const key of [undefined, 'dsec_wrong']) {
        const res = await call(r.method, pathFor(r), key, bodyOf(r.method));
        const want = r.url.startsWith('/v1/port-links/') ? 307 : 401;
        if (res.statusCode !== want) wrong.push(`${r.method} ${r.url} (${key ?? 'no key'}): ${res.statusCode} ${res.body.slice(0, 120)}`);
      }
    }
    assert.deepEqual(wrong, []);
  });

  test("another project's key: admin routes 403, cluster routes 401, this sandbox's routes as for an unknown sandbox", async () => {
    const wrong: string[] = [];
    for (const r of routes) {
      const kind = r.access?.kind;
      const res = await call(r.method, pathFor(r), keys.b, bodyOf(r.method));
      if (res.statusCode >= 500 && res.statusCode !== 501) wrong.push(`${r.method} ${r.url}: ${res.statusCode} ${res.body.slice(0, 160)}`);
      else if ((kind === 'admin' || kind === 'clusterOrAdmin') && res.statusCode !== 403)
        wrong.push(`${r.method} ${r.url}: ${res.statusCode}, want 403`);
      else if (kind === 'cluster' && res.statusCode !== 401) wrong.push(`${r.method} ${r.url}: ${res.statusCode}, want 401`);
      else if (
        r.url.startsWith('/v1/sandboxes/:id') &&
        res.statusCode < 300 &&
        !(r.method === 'DELETE' && r.url === '/v1/sandboxes/:id' && res.statusCode === 204)
      )
        wrong.push(`${r.method} ${r.url}: ${res.statusCode}: another project's sandbox answered`);
    }
    assert.deepEqual(wrong, []);
    assert.equal(
      ((await call('GET', `/v1/sandboxes/${sandbox.id}`, keys.a)).json() as SandboxInfo).status,
      'running',
      "B's kill did nothing",
    );
  });

  test("the project's own key and an admin key reach their routes: no 401, no 403 on key routes, no 5xx but the simulated edge's", async () => {
    const wrong: string[] = [];
    for (const r of routes.filter(walkable)) {
      const kind = r.access?.kind;
      if (kind !== 'key' && kind !== 'admin') continue;
      for (const who of ['a', 'admin'] as const) {
        if (kind === 'admin' && who === 'a') continue;
        const res = await call(r.method, pathFor(r), keys[who], bodyOf(r.method));
        if (res.statusCode === 401 || (res.statusCode === 403 && kind === 'admin'))
          wrong.push(`${r.method} ${r.url} (${who}): ${res.statusCode} ${res.body.slice(0, 120)}`);
        // The simulated edge refuses what it cannot do (exec, files, ports) with a 4xx that says so.
        if (res.statusCode >= 500 && res.statusCode !== 501 && res.statusCode !== 503)
          wrong.push(`${r.method} ${r.url} (${who}): ${res.statusCode} ${res.body.slice(0, 160)}`);
      }
    }
    assert.deepEqual(wrong, []);
  });

  test('revoking a key revokes the E2B keys it minted, at any depth (red team round three)', async () => {
    const parent = await createApiKey(store, 'parent', { project: 'team-a' });
    const minted = await call('POST', '/v1/e2b/keys', parent.key, { name: 'child' });
    assert.equal(minted.statusCode, 201, minted.body);
    const child = minted.json() as { id: string; key: string };
    const grandchild = (await call('POST', '/v1/e2b/keys', child.key, { name: 'grandchild' })).json() as { id: string; key: string };
    const listed = (await call('GET', '/v1/keys?project=team-a', keys.admin)).json() as { keys: { id: string; mintedBy?: string }[] };
    assert.equal(listed.keys.find((k) => k.id === child.id)?.mintedBy, parent.id, 'the list says who minted it');
    for (const k of [parent.key, child.key, grandchild.key]) assert.equal((await call('GET', '/v1/sandboxes', k)).statusCode, 200);
    assert.equal((await call('DELETE', `/v1/keys/${parent.id}`, keys.admin)).statusCode, 204);
    for (const k of [parent.key, child.key, grandchild.key]) assert.equal((await call('GET', '/v1/sandboxes', k)).statusCode, 401);
    assert.equal((await call('GET', '/v1/sandboxes', keys.a)).statusCode, 200, 'other keys of the project stay');
  });

  test('a percent-encoded fixed segment is 400 on every route, with or without a key', async () => {
    const wrong: string[] = [];
    for (const r of routes) {
      const path = pathFor(r);
      const encoded = `/%${path.charCodeAt(1).toString(16)}${path.slice(2)}`;
      for (const key of [undefined, keys.admin]) {
        const res = await call(r.method, encoded, key, bodyOf(r.method));
        if (res.statusCode !== 400) wrong.push(`${r.method} ${encoded}: ${res.statusCode} ${res.body.slice(0, 120)}`);
      }
    }
    assert.deepEqual(wrong, []);
  });
});
