/**
 * The fast tier, continued: the surfaces route-access.test.ts does not walk, in process, without
 * root. The edge daemon's routes (`dsec edge`, cluster token only), the port-link origin (a signed
 * link only) and E2B's sandbox side (a sandbox's access token only), each walked route by route
 * from `declaredRoutes`, so a route added later is walked too.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { createApiKey } from '../../src/control/api-keys.js';
import { ControlPlane } from '../../src/control/control-plane.js';
import { PortLinkGate, PortLinks } from '../../src/control/ports/port-links.js';
import { buildPortsServer } from '../../src/control/ports/ports-server.js';
import { buildServer } from '../../src/control/server.js';
import { StateStore } from '../../src/control/state-store.js';
import { buildEdgeServer } from '../../src/edge/server/edge-server.js';
import { SimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import type { App } from '../../src/http/app.js';
import { declaredRoutes } from '../../src/http/access.js';
import { defaultImageConfig, ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { bodyOf, pathOf } from './support/route-walk.js';

const TOKEN = 'dsecjoin_daemons';

describe('fast tier: the edge daemon, the port-link origin and the E2B sandbox side, in process', () => {
  let dir: string;
  let store: StateStore;
  let control: ControlPlane;
  let api: App;
  let edgeApp: App;
  let portsApp: App;
  let links: PortLinks;
  let sandbox: SandboxInfo;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-fast-daemons-'));
    const log = pino({ level: 'silent' });
    store = await StateStore.open(':memory:');
    const layers = new LayerStore(join(dir, 'layers'));
    const images = new ImageStore(join(dir, 'images'), layers);
    const digest = await layers.addStream(Readable.from([Buffer.from('a placeholder layer')]));
    images.tag('busybox', images.put({ layers: [digest], config: defaultImageConfig() }));
    control = new ControlPlane(store, images, log);
    const edge = new SimulatedEdge('fastdaemon');
    await control.edges.addLocal('fastdaemon', edge);
    links = new PortLinks(TOKEN);
    api = await buildServer({
      control,
      store,
      images,
      log,
      clusterToken: TOKEN,
      links,
      portsOrigin: () => 'http://127.0.0.1:1',
      dataDir: dir,
    });
    edgeApp = await buildEdgeServer(edge, { token: TOKEN, log });
    portsApp = await buildPortsServer({
      control,
      linkGate: new PortLinkGate(links, { projectOf: (id) => store.sandboxes.projectOf(id) }),
      log,
    });
    await Promise.all([api.ready(), edgeApp.ready(), portsApp.ready()]);
    const key = (await createApiKey(store, 'a', { project: 'default' })).key;
    const made = await api.inject({
      method: 'POST',
      url: '/v1/sandboxes',
      headers: { authorization: `Bearer ${key}` },
      payload: { image: 'busybox' },
    });
    assert.equal(made.statusCode, 201, made.body);
    sandbox = made.json() as SandboxInfo;
  });
  after(async () => {
    await Promise.all([api?.close(), edgeApp?.close(), portsApp?.close()]);
    await store?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("the edge daemon: every route is the cluster's; no token or a wrong one is 401, the token reaches it", async () => {
    const routes = declaredRoutes(edgeApp).filter((r) => r.method !== 'HEAD');
    assert.ok(routes.length > 20, `${routes.length} edge routes`);
    const wrong: string[] = [];
    for (const r of routes) {
      if (r.access?.kind !== 'cluster') wrong.push(`${r.method} ${r.url}: declared ${r.access?.kind ?? 'nothing'}, not cluster`);
      const url = pathOf(r.url, { id: sandbox.id });
      for (const auth of [undefined, 'Bearer dsecjoin_wrong', `Bearer ${TOKEN.slice(0, -1)}`]) {
        const res = await edgeApp.inject({
          method: r.method as 'GET',
          url,
          headers: auth ? { authorization: auth } : {},
          payload: bodyOf(r.method),
        });
        if (res.statusCode !== 401) wrong.push(`${r.method} ${r.url} (${auth ?? 'no token'}): ${res.statusCode} ${res.body.slice(0, 100)}`);
      }
      const ok = await edgeApp.inject({
        method: r.method as 'GET',
        url,
        headers: { authorization: `Bearer ${TOKEN}` },
        payload: bodyOf(r.method),
      });
      if (ok.statusCode === 401 || ok.statusCode === 403)
        wrong.push(`${r.method} ${r.url} (the token): ${ok.statusCode} ${ok.body.slice(0, 100)}`);
    }
    assert.deepEqual(wrong, []);
    // A path no route matches needs the token too: an unknown edge path tells nothing without it.
    assert.equal((await edgeApp.inject({ method: 'GET', url: '/nothing/here' })).statusCode, 401);
  });

  test('the port-link origin: only a signed link opens anything; a forged, foreign or expired one is 401', async () => {
    const routes = declaredRoutes(portsApp).filter((r) => r.method !== 'HEAD');
    assert.ok(routes.length > 0);
    for (const r of routes) assert.equal(r.access?.kind, 'link', `${r.method} ${r.url}`);
    const good = links.sign({ sandbox: sandbox.id, port: 8000, expires: Math.floor(Date.now() / 1000) + 600, project: 'default' });
    const forged = `${good.slice(0, -4)}AAAA`;
    const foreign = links.sign({ sandbox: sandbox.id, port: 8000, expires: Math.floor(Date.now() / 1000) + 600, project: 'someone-else' });
    const expired = links.sign({ sandbox: sandbox.id, port: 8000, expires: Math.floor(Date.now() / 1000) - 1, project: 'default' });
    const other = new PortLinks('dsecjoin_another_cluster').sign({
      sandbox: sandbox.id,
      port: 8000,
      expires: Math.floor(Date.now() / 1000) + 600,
      project: 'default',
    });
    for (const token of ['', 'x', forged, foreign, expired, other]) {
      const res = await portsApp.inject({ method: 'GET', url: `/v1/port-links/${encodeURIComponent(token)}/` });
      assert.equal(res.statusCode, 401, `${token || '(empty)'}: ${res.statusCode} ${res.body.slice(0, 100)}`);
    }
    // The good link passes the gate; the simulated edge has no port to open, which it says (not 401).
    const res = await portsApp.inject({ method: 'GET', url: `/v1/port-links/${good}/` });
    assert.notEqual(res.statusCode, 401, res.body);
    // API keys open nothing here: the link is the only credential this origin reads.
    const key = (await createApiKey(store, 'admin-here', { admin: true })).key;
    assert.equal(
      (await portsApp.inject({ method: 'GET', url: '/v1/port-links/x/', headers: { authorization: `Bearer ${key}` } })).statusCode,
      401,
    );
  });

  test("E2B's sandbox side: every route takes a sandbox's access token; none, or one that opens no sandbox, never runs", async () => {
    const routes = declaredRoutes(api).filter((r) => r.method !== 'HEAD' && r.url.startsWith('/e2b-sandbox'));
    assert.ok(routes.length >= 4, `${routes.length} sandbox-side routes`); // /health, /files (GET, POST) and the Connect services
    const wrong: string[] = [];
    const adminKey = (await createApiKey(store, 'admin-e2b', { admin: true })).key;
    for (const r of routes) {
      if (r.access?.kind !== 'sandboxToken') wrong.push(`${r.method} ${r.url}: declared ${r.access?.kind ?? 'nothing'}`);
      // Through the rewrite, as E2B's SDK sends it: the path without the prefix, the sandbox in a header.
      const url = r.url.replace(/^\/e2b-sandbox/, '') || '/';
      const attempts: [string, Record<string, string>, number[]][] = [
        ['no token', { 'e2b-sandbox-id': sandbox.id }, [401]],
        // A sandbox not made through the E2B API has no access token: the answer is the one for a gone sandbox.
        ['a made-up token', { 'e2b-sandbox-id': sandbox.id, 'x-access-token': 'ea_made_up' }, [502]],
        ['an admin API key', { 'e2b-sandbox-id': sandbox.id, 'x-api-key': adminKey, authorization: `Bearer ${adminKey}` }, [401]],
        ['no sandbox id', {}, [400, 404]],
      ];
      for (const [what, headers, wanted] of attempts) {
        // /health answers every refusal as E2B's proxy does, 502 (sandbox-routes.ts: the SDK's health check reads it so).
        const want = r.url.endsWith('/health') && headers['e2b-sandbox-id'] ? [502] : wanted;
        const res = await api.inject({ method: r.method as 'GET', url: pathOf(url), headers, payload: bodyOf(r.method) });
        if (!want.includes(res.statusCode))
          wrong.push(`${r.method} ${url} (${what}): ${res.statusCode}, want ${want.join('|')}: ${res.body.slice(0, 100)}`);
      }
    }
    assert.deepEqual(wrong, []);
  });
});
