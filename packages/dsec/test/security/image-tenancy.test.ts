/**
 * Images between projects and registries (issue 27, finding 2): POST /v1/images/push|pull and
 * stacked layers, with two project keys (team-a, team-b) and the bootstrap admin key, against a
 * control plane whose cluster registry is a real docker-registry with htpasswd auth on loopback,
 * and small fake registries (node http servers on 127.0.0.1) that record what they are sent.
 *
 * - push resolves the image as the caller: B cannot push A's private image;
 * - a pull is the caller's project's image (an admin key's is shared) and never moves a name
 *   another owner holds (409 IMAGE_NAME_TAKEN, nothing changed);
 * - a project key names only the cluster's registry and those of DSEC_REGISTRY_ALLOW (403);
 * - the registry account goes only to the cluster's registry: not to an allowed registry that asks
 *   for Basic auth, not to a Bearer realm on another port, not across a redirect;
 * - a layer digest only another project's private image holds answers as an unknown digest.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { writeFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { compileOptions } from '../../src/config/options.js';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { pushImage } from '../../src/image/registry/image-push.js';
import { RegistryAuthError, RegistryClient } from '../../src/image/registry/registry-client.js';
import { parseRegistryRef } from '../../src/image/registry/registry-ref.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startControlPlane } from '../../src/runtime/all-in-one.js';
import { buildTestImage } from '../helpers/images.js';
import { registrySkipReason, startTestRegistry, type TestRegistry } from '../helpers/registry.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir } from '../helpers/server.js';

interface Seen {
  method: string;
  url: string;
  authorization: string | undefined;
}

/** A loopback HTTP server that records every request and answers with `handle`. */
async function fakeServer(
  handle: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<{ host: string; seen: Seen[]; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '', authorization: req.headers.authorization });
    req.resume();
    handle(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const host = `127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    host,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const basic401 = (_req: IncomingMessage, res: ServerResponse): void => {
  res
    .writeHead(401, { 'www-authenticate': 'Basic realm="fake"', 'content-type': 'application/json' })
    .end(JSON.stringify({ errors: [{ code: 'UNAUTHORIZED', message: 'authentication required' }] }));
};

describe('images between projects and registries', { skip: integrationSkipReason() ?? registrySkipReason(), timeout: 300_000 }, () => {
  let registry: TestRegistry;
  let control: Awaited<ReturnType<typeof startControlPlane>>;
  let controlDir: string;
  let otherDir: string;
  let admin: string;
  let keyA: string;
  let keyB: string;
  let aPrivate: { id: string; layer: string };
  /** Allowed, asks for Basic auth. */
  let basicFake: Awaited<ReturnType<typeof fakeServer>>;
  /** Not allowed, asks for Basic auth. */
  let notAllowed: Awaited<ReturnType<typeof fakeServer>>;
  /** A token service on another loopback port. */
  let tokens: Awaited<ReturnType<typeof fakeServer>>;
  /** Allowed, asks for a Bearer token from `tokens`. */
  let bearerFake: Awaited<ReturnType<typeof fakeServer>>;
  const saved = {
    user: process.env['DSEC_REGISTRY_USER'],
    password: process.env['DSEC_REGISTRY_PASSWORD'],
    tokenHosts: process.env['DSEC_REGISTRY_TOKEN_HOSTS'],
  };

  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- a test reads any JSON body
  const api = async (key: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> => {
    const res = await fetch(`${control.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : undefined };
  };
  const imageIds = async (key: string): Promise<string[]> =>
    ((await api(key, 'GET', '/v1/images')).body as { images: { id: string }[] }).images.map((i) => i.id);
  const resolves = async (key: string, ref: string): Promise<string | undefined> => {
    const r = await api(key, 'GET', `/v1/images/${encodeURIComponent(ref)}`);
    return r.status === 200 ? (r.body as { id: string }).id : undefined;
  };
  const credsSeen = (seen: Seen[]): string[] =>
    seen.map((s) => s.authorization).filter((a): a is string => a !== undefined && a.startsWith('Basic '));

  before(async () => {
    registry = await startTestRegistry({ auth: true });
    basicFake = await fakeServer(basic401);
    notAllowed = await fakeServer(basic401);
    tokens = await fakeServer((_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: 'fake-token' })),
    );
    bearerFake = await fakeServer((req, res) => {
      if (req.headers.authorization === 'Bearer fake-token') {
        res
          .writeHead(404, { 'content-type': 'application/json' })
          .end(JSON.stringify({ errors: [{ code: 'MANIFEST_UNKNOWN', message: 'no such manifest' }] }));
        return;
      }
      res
        .writeHead(401, { 'www-authenticate': `Bearer realm="http://${tokens.host}/token",service="fake",scope="repository:team/x:pull"` })
        .end();
    });
    // The control plane reads its registry account from its environment (at start and per request).
    process.env['DSEC_REGISTRY_USER'] = registry.credentials!.username;
    process.env['DSEC_REGISTRY_PASSWORD'] = registry.credentials!.password;
    delete process.env['DSEC_REGISTRY_TOKEN_HOSTS'];
    controlDir = makeDataDir();
    otherDir = makeDataDir();
    control = await startControlPlane(
      compileOptions(
        {
          dataDir: controlDir,
          registry: `${registry.host}/tenancy/cluster`,
          registryAllow: `${basicFake.host},${bearerFake.host}`,
          listen: '127.0.0.1:0',
          logLevel: 'silent',
        },
        {},
      ),
    );
    await buildBusyboxImage(control.images);
    admin = control.apiKey;
    for (const p of ['team-a', 'team-b']) assert.equal((await api(admin, 'POST', '/v1/projects', { name: p })).status, 201);
    keyA = (await api(admin, 'POST', '/v1/keys', { project: 'team-a', name: 'a' })).body.key as string;
    keyB = (await api(admin, 'POST', '/v1/keys', { project: 'team-b', name: 'b' })).body.key as string;
    // A's private image, recorded as a snapshot of A's records it (ProjectImages.claim, a name of A's).
    const built = await buildTestImage(control.images, 'aprivate:v1', (root) => writeFileSync(`${root}/secret`, 'team-a only'));
    await control.control.projectImages.claim('team-a', built.id, false);
    await control.control.projectImages.recordName('aprivate:v1', 'team-a');
    aPrivate = { id: built.id, layer: control.images.get(built.id)!.layers[0]! };
    await control.images.flush();
  });
  after(async () => {
    for (const [k, v] of [
      ['DSEC_REGISTRY_USER', saved.user],
      ['DSEC_REGISTRY_PASSWORD', saved.password],
      ['DSEC_REGISTRY_TOKEN_HOSTS', saved.tokenHosts],
    ] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await control?.close({ killAll: true });
    if (controlDir) await assertCleanAndRemove(controlDir, 'control');
    if (otherDir) await assertCleanAndRemove(otherDir, 'none');
    for (const f of [basicFake, notAllowed, tokens, bearerFake]) await f?.close();
    await registry?.close();
  });

  test("B cannot push A's private image (by name or id): the answer of an unknown image, and nothing reaches the registry", async () => {
    assert.deepEqual(await imageIds(keyB).then((ids) => ids.includes(aPrivate.id)), false, 'B does not list it');
    const unknown = await api(keyB, 'POST', '/v1/images/push', { image: 'nosuchimage:v1', ref: `${registry.host}/tenancy/stolen:v1` });
    for (const image of ['aprivate:v1', aPrivate.id]) {
      const r = await api(keyB, 'POST', '/v1/images/push', { image, ref: `${registry.host}/tenancy/stolen:v1` });
      assert.equal(r.status, 404, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'IMAGE_NOT_FOUND');
      assert.equal(r.body.error.code, unknown.body.error.code);
    }
    const reader = new RegistryClient(parseRegistryRef(`${registry.host}/tenancy/stolen:v1`), { credentials: registry.credentials });
    assert.equal(await reader.getManifest('v1'), undefined, 'no manifest was pushed');
    // A may push its own.
    const own = await api(keyA, 'POST', '/v1/images/push', { image: 'aprivate:v1', ref: `${registry.host}/tenancy/apush:v1` });
    assert.equal(own.status, 200, JSON.stringify(own.body));
  });

  test("B's pull is B's: private to team-b, not seen by A; an admin key's pull is shared", async () => {
    // Images the control plane has never seen, pushed to the cluster's registry from another store.
    const other = new ImageStore(otherDir, new LayerStore(otherDir));
    const bImg = await buildTestImage(other, 'bonly:v1', (root) => writeFileSync(`${root}/marker`, 'b'));
    const sharedImg = await buildTestImage(other, 'adminpulled:v1', (root) => writeFileSync(`${root}/marker`, 'shared'));
    for (const [name, repo] of [
      ['bonly:v1', 'bonly'],
      ['adminpulled:v1', 'adminpulled'],
    ] as const) {
      await pushImage(
        other,
        name,
        new RegistryClient(parseRegistryRef(`${registry.host}/tenancy/${repo}:v1`), { credentials: registry.credentials }),
        'v1',
      );
    }
    const pulled = await api(keyB, 'POST', '/v1/images/pull', { ref: `${registry.host}/tenancy/bonly:v1`, name: 'bonly:v1' });
    assert.equal(pulled.status, 201, JSON.stringify(pulled.body));
    assert.equal(pulled.body.image.id, bImg.id);
    assert.equal(await resolves(keyB, 'bonly:v1'), bImg.id, 'B sees its pull');
    assert.ok((await imageIds(keyB)).includes(bImg.id));
    assert.equal(await resolves(keyA, 'bonly:v1'), undefined, 'A does not see the name');
    assert.equal(await resolves(keyA, bImg.id), undefined, 'A does not see the id');
    assert.ok(!(await imageIds(keyA)).includes(bImg.id), 'A does not list it');
    const aCreate = await api(keyA, 'POST', '/v1/sandboxes', { image: bImg.id });
    assert.equal(aCreate.status, 404, JSON.stringify(aCreate.body));
    assert.equal(aCreate.body.error.code, 'IMAGE_NOT_FOUND');

    const shared = await api(admin, 'POST', '/v1/images/pull', { ref: `${registry.host}/tenancy/adminpulled:v1` });
    assert.equal(shared.status, 201, JSON.stringify(shared.body));
    assert.equal(await resolves(keyA, 'adminpulled:v1'), sharedImg.id, "an admin key's pull is shared");
  });

  test('a pull never moves a name another owner holds: 409 IMAGE_NAME_TAKEN, and the name still resolves to what it did', async () => {
    const busybox = control.images.resolve('busybox:latest')!;
    assert.equal(await resolves(keyA, 'busybox'), busybox);
    const cases: [string, string, Record<string, string>][] = [
      ['B into the shared busybox:latest', keyB, { ref: `${registry.host}/tenancy/bonly:v1`, name: 'busybox:latest' }],
      ["B into busybox:latest by the ref's default name", keyB, { ref: `${registry.host}/other/busybox:latest` }],
      ["B into A's name", keyB, { ref: `${registry.host}/tenancy/bonly:v1`, name: 'aprivate:v1' }],
      ["an admin key into A's name", admin, { ref: `${registry.host}/tenancy/bonly:v1`, name: 'aprivate:v1' }],
      ["A into B's name", keyA, { ref: `${registry.host}/tenancy/apush:v1`, name: 'bonly:v1' }],
    ];
    for (const [what, key, body] of cases) {
      const r = await api(key, 'POST', '/v1/images/pull', body);
      assert.equal(r.status, 409, `${what}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error.code, 'IMAGE_NAME_TAKEN', what);
    }
    assert.equal(await resolves(keyA, 'busybox:latest'), busybox, 'busybox resolves for A as before');
    assert.equal(await resolves(admin, 'busybox:latest'), busybox, 'and for the admin');
    assert.equal(await resolves(keyA, 'aprivate:v1'), aPrivate.id, "A's name is A's image still");
    assert.notEqual(await resolves(keyB, 'bonly:v1'), undefined, "B's name is B's still");
  });

  test('a project key names only allowed registries (403 FORBIDDEN, nothing sent); an admin key any', async () => {
    for (const [path, body] of [
      ['/v1/images/pull', { ref: `${notAllowed.host}/team/x:v1` }],
      ['/v1/images/push', { ref: `${notAllowed.host}/team/x:v1`, image: 'busybox' }],
    ] as const) {
      const r = await api(keyB, 'POST', path, body);
      assert.equal(r.status, 403, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'FORBIDDEN');
      assert.match(r.body.error.message, /--registry-allow.*DSEC_REGISTRY_ALLOW/);
    }
    assert.equal(notAllowed.seen.length, 0, 'the control plane did not connect');
    const byAdmin = await api(admin, 'POST', '/v1/images/pull', { ref: `${notAllowed.host}/team/x:v1` });
    assert.equal(byAdmin.body.error.code, 'REGISTRY_AUTH_FAILED', JSON.stringify(byAdmin.body)); // the fake wants credentials it does not get
    assert.ok(notAllowed.seen.length > 0, 'an admin key may name any registry');
    assert.deepEqual(credsSeen(notAllowed.seen), [], 'and it gets no credentials either');
  });

  test("the registry account goes only to the cluster's registry: not to an allowed one asking for Basic auth, nor to a Bearer realm on another port", async () => {
    for (const key of [keyB, admin]) {
      const r = await api(key, 'POST', '/v1/images/pull', {
        ref: `${basicFake.host}/team/x:v1`,
        name: `fromfake-${key === admin ? 'admin' : 'b'}:v1`,
      });
      assert.equal(r.status, 403, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'REGISTRY_AUTH_FAILED');
      const p = await api(key, 'POST', '/v1/images/push', { ref: `${basicFake.host}/team/x:v1`, image: 'busybox' });
      assert.equal(p.body.error.code, 'REGISTRY_AUTH_FAILED', JSON.stringify(p.body));
    }
    assert.ok(basicFake.seen.length > 0);
    assert.deepEqual(credsSeen(basicFake.seen), [], 'no Basic credentials reached the allowed registry');

    const r = await api(keyB, 'POST', '/v1/images/pull', { ref: `${bearerFake.host}/team/x:v1`, name: 'frombearer:v1' });
    assert.equal(r.status, 404, JSON.stringify(r.body)); // the anonymous token works; the fake has no manifest
    assert.ok(tokens.seen.length > 0, 'the token realm was asked');
    assert.deepEqual(credsSeen(tokens.seen), [], 'no credentials reached the token realm');
    assert.deepEqual(credsSeen(bearerFake.seen), []);
  });

  test('the client itself (as `dsec image pull` uses it): a Bearer realm on another origin and a redirect elsewhere are not sent the credentials', async () => {
    const creds = { username: 'trainer', password: 'secret-never-sent' };
    const before = tokens.seen.length;
    const client = new RegistryClient(parseRegistryRef(`${bearerFake.host}/team/x:v1`), { credentials: creds, tokenHosts: [] });
    assert.equal(await client.getManifest('v1'), undefined);
    assert.ok(tokens.seen.length > before);
    assert.deepEqual(credsSeen(tokens.seen.slice(before)), [], 'the realm on another port was asked anonymously');
    // Trusted by name (DSEC_REGISTRY_TOKEN_HOSTS), it gets them.
    const trusted = new RegistryClient(parseRegistryRef(`${bearerFake.host}/team/x:v1`), { credentials: creds, tokenHosts: [tokens.host] });
    const mark = tokens.seen.length;
    await trusted.getManifest('v1');
    assert.equal(credsSeen(tokens.seen.slice(mark)).length, 1);

    const elsewhere = await fakeServer((_req, res) => res.writeHead(404).end());
    const redirecting = await fakeServer((req, res) => {
      if (req.headers.authorization) res.writeHead(307, { location: `http://${elsewhere.host}/v2/team/x/manifests/v1` }).end();
      else basic401(req, res);
    });
    try {
      const c = new RegistryClient(parseRegistryRef(`${redirecting.host}/team/x:v1`), { credentials: creds });
      assert.equal(await c.getManifest('v1'), undefined);
      assert.equal(credsSeen(redirecting.seen).length, 1, 'the registry named gets them');
      assert.ok(elsewhere.seen.length > 0, 'the redirect was followed');
      assert.deepEqual(credsSeen(elsewhere.seen), [], 'the other host of the redirect does not');
    } finally {
      await elsewhere.close();
      await redirecting.close();
    }
    // A realm that refuses anonymous tokens: the error says why no credentials were sent.
    const refusing = await fakeServer((_req, res) => res.writeHead(401).end());
    const asking = await fakeServer((_req, res) =>
      res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${refusing.host}/token"` }).end(),
    );
    try {
      await assert.rejects(
        new RegistryClient(parseRegistryRef(`${asking.host}/team/x:v1`), { credentials: creds, tokenHosts: [] }).getManifest('v1'),
        (err: unknown) => {
          assert.ok(err instanceof RegistryAuthError);
          assert.match(err.message, /not on the registry's host.*DSEC_REGISTRY_TOKEN_HOSTS/);
          return true;
        },
      );
      assert.deepEqual(credsSeen(refusing.seen), []);
    } finally {
      await refusing.close();
      await asking.close();
    }
  });

  test("a layer only another project's private image holds cannot be stacked by digest: the answer of an unknown digest", async () => {
    const unknownDigest = `sha256:${'0'.repeat(64)}`;
    const unknown = await api(keyB, 'POST', '/v1/sandboxes', { image: 'busybox', layers: [unknownDigest] });
    assert.equal(unknown.status, 404, JSON.stringify(unknown.body));
    const stolen = await api(keyB, 'POST', '/v1/sandboxes', { image: 'busybox', layers: [aPrivate.layer] });
    assert.equal(stolen.status, 404, JSON.stringify(stolen.body));
    assert.equal(stolen.body.error.code, unknown.body.error.code);
    assert.equal(stolen.body.error.code, 'IMAGE_NOT_FOUND');
    // A may stack its own layer, and B a shared one: past the image check (no edge here to place them).
    const busyboxLayer = control.images.get(control.images.resolve('busybox')!)!.layers[0]!;
    for (const [key, layer] of [
      [keyA, aPrivate.layer],
      [keyB, busyboxLayer],
    ] as const) {
      const r = await api(key, 'POST', '/v1/sandboxes', { image: 'busybox', layers: [layer] });
      assert.notEqual(r.body?.error?.code, 'IMAGE_NOT_FOUND', JSON.stringify(r.body));
    }
  });
});
