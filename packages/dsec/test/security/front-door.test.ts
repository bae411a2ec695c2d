/**
 * The front door (red team, round three, finding 1): every route the control plane, an edge and
 * the E2B layer serve, walked with no key, a wrong key, another project's key and the cluster
 * token where it does not belong, each also as an absolute-form target and with a static segment
 * percent-encoded. Access is decided from the matched route (http/access.ts), so no spelling of a
 * path reaches a route without its credentials; then fast-check throws generated request targets
 * at the running server and finds no 2xx without credentials.
 *
 * A real `dsec control` (SQLite, the busybox image) with a SIMULATED edge (no crun: it only
 * records sandboxes) joined over the edge protocol, on loopback.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, describe, test } from 'node:test';
import fc from 'fast-check';
import type { CreatedKey, SandboxInfo } from '@dsec/sdk/schema';
import { startSimulatedEdge, type RunningSimulatedEdge } from '../../src/edge/simulated/simulated-edge.js';
import { compileOptions } from '../../src/config/options.js';
import { declaredRoutes, type Access } from '../../src/http/access.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { startControlPlane, type RunningControl } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir } from '../helpers/server.js';

interface Answer {
  status: number;
  head: string;
  body: string;
}

/**
 * One request written byte for byte on a socket, so the target is sent exactly as given
 * (fetch would normalise an absolute-form or encoded target away). Reads to the end of the
 * answer's head and body (Connection: close).
 */
function rawRequest(base: string, method: string, target: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const sock = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    sock.setTimeout(15_000, () => sock.destroy(new Error(`no answer to ${method} ${target} in 15 s`)));
    sock.on('data', (c: Buffer) => chunks.push(c));
    sock.on('error', reject);
    sock.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
      if (!m) return reject(new Error(`no HTTP answer to ${method} ${target}: ${JSON.stringify(text.slice(0, 200))}`));
      const split = text.indexOf('\r\n\r\n');
      resolve({ status: Number(m[1]), head: text.slice(0, split), body: text.slice(split + 4) });
    });
    const lines = [`${method} ${target} HTTP/1.1`, `Host: ${hostname}:${port}`, 'Connection: close'];
    for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`);
    if (body !== undefined) lines.push('Content-Type: application/json', `Content-Length: ${Buffer.byteLength(body)}`);
    sock.write(`${lines.join('\r\n')}\r\n\r\n${body ?? ''}`);
  });
}

/** A concrete path for a route pattern: parameters filled with values that exist where it matters. */
function concretePath(pattern: string, values: Record<string, string>): string {
  return pattern
    .split('/')
    .map((seg) => (seg === '*' ? 'x' : seg.startsWith(':') ? (values[seg.slice(1)] ?? 'x') : seg))
    .join('/');
}

/** The same path with the first letter of its first static segment percent-encoded (`/v1` → `/%761`). */
function encodedVariant(path: string): string | undefined {
  const m = /^\/([A-Za-z])/.exec(path);
  if (!m) return undefined;
  return `/%${m[1]!.charCodeAt(0).toString(16)}${path.slice(2)}`;
}

const WRITES = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const needsCredentials = (a: Access | undefined): boolean => a?.kind !== 'public';

describe('the front door: access from the matched route, for every route', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let control: RunningControl;
  let edge: RunningSimulatedEdge;
  let dataDir: string;
  let keyA: CreatedKey;
  let keyB: CreatedKey;
  let sandbox: SandboxInfo;
  let values: Record<string, string>;
  let routes: { method: string; url: string; access: Access | undefined }[];

  const api = async (key: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> => {
    const res = await fetch(`${control.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return { status: res.status, body: res.status === 204 ? undefined : await res.json() };
  };

  before(async () => {
    dataDir = makeDataDir();
    control = await startControlPlane(compileOptions({ dataDir, listen: '127.0.0.1:0', logLevel: 'silent' }, {}));
    await buildBusyboxImage(control.images);
    edge = await startSimulatedEdge({ join: control.url, token: control.joinToken, id: 'doorone' });
    for (const name of ['team-a', 'team-b']) assert.equal((await api(control.apiKey, 'POST', '/v1/projects', { name })).status, 201);
    keyA = (await api(control.apiKey, 'POST', '/v1/keys', { project: 'team-a', name: 'a' })).body as CreatedKey;
    keyB = (await api(control.apiKey, 'POST', '/v1/keys', { project: 'team-b', name: 'b' })).body as CreatedKey;
    const made = await api(keyA.key, 'POST', '/v1/sandboxes', { image: 'busybox', resources: { memoryMiB: 64 } });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    sandbox = made.body as SandboxInfo;
    const digest = control.images.get(control.images.resolve('busybox')!)!.layers[0]!;
    values = {
      id: sandbox.id,
      port: '8000',
      pid: '1',
      sid: 'ses_x',
      digest,
      name: 'busybox',
      ref: 'busybox',
      service: 'process.Process',
      method: 'List',
    };
    routes = declaredRoutes(control.app);
  });

  after(async () => {
    await edge?.close();
    await control?.close();
    await assertCleanAndRemove(dataDir, 'none');
  });

  test('every route is declared, and every operation of the OpenAPI document is a route served', async () => {
    assert.ok(routes.length > 60, `only ${routes.length} routes seen`);
    assert.deepEqual(
      routes.filter((r) => !r.access).map((r) => `${r.method} ${r.url}`),
      [],
    );
    const doc = (await api(control.apiKey, 'GET', '/v1/openapi.json')).body as { paths: Record<string, Record<string, unknown>> };
    const served = new Set(routes.map((r) => `${r.method} ${r.url}`));
    for (const [path, ops] of Object.entries(doc.paths))
      for (const method of Object.keys(ops)) {
        const pattern = path.replace(/\{([^}]+)\}/g, ':$1');
        assert.ok(served.has(`${method.toUpperCase()} ${pattern}`), `${method} ${path} is documented but not among the declared routes`);
      }
  });

  /**
   * Walks every route with the given credentials and checks each answer. `expect` gets the route
   * and the answer and says what is wrong, or undefined.
   */
  const walk = async (
    base: string,
    list: { method: string; url: string; access: Access | undefined }[],
    headers: Record<string, string>,
    expect: (r: { method: string; url: string; access: Access | undefined }, a: Answer, variant: string) => string | undefined,
  ): Promise<void> => {
    const wrong: string[] = [];
    for (const r of list) {
      if (r.method === 'HEAD' && list.some((o) => o.method === 'GET' && o.url === r.url)) continue;
      const path = concretePath(r.url, values);
      const e2b = r.url.startsWith('/e2b-sandbox');
      // The E2B sandbox side is reached only by the rewrite: E2b-Sandbox-Id and the path envd serves.
      const sent = e2b ? path.slice('/e2b-sandbox'.length) || '/' : path;
      const h = e2b ? { ...headers, 'E2b-Sandbox-Id': sandbox.id } : headers;
      const body = WRITES.has(r.method) ? '{}' : undefined;
      const variants: [string, string][] = [
        ['as is', sent],
        ['absolute-form', `http://127.0.0.1${sent}`],
      ];
      const enc = encodedVariant(sent);
      if (enc) variants.push(['encoded', enc]);
      for (const [variant, target] of variants) {
        const a = await rawRequest(base, r.method, target, h, body);
        // 501 is E2B's documented "not supported" for routes dsec declines; health's refusal is 502.
        const documented5xx = a.status === 501 || (r.access?.kind === 'sandboxToken' && a.status === 502);
        if (a.status >= 500 && !documented5xx) wrong.push(`${r.method} ${target} (${variant}): ${a.status} ${a.body.slice(0, 200)}`);
        const why = expect(r, a, variant);
        if (why) wrong.push(`${r.method} ${target} (${variant}): ${why}: ${a.status} ${a.body.slice(0, 160)}`);
      }
    }
    assert.deepEqual(wrong, []);
  };

  /**
   * A target spelled otherwise never reaches its route: an absolute-form target is 400 (404 on
   * the E2B sandbox side, whose rewrite sends it nowhere); an encoded fixed segment is 400 (502 at
   * E2B's health, which refuses everything alike); an encoded *parameter* is the parameter, and
   * meets the route's own refusal.
   */
  const respelled = (r: { access: Access | undefined; url: string }, a: Answer, variant: string): string | undefined => {
    if (a.status < 400) return 'a respelled target reached its route';
    if (r.url === '/e2b-sandbox/health' && a.status === 502) return undefined;
    if (variant === 'absolute-form')
      return a.status === 400 || (r.url.startsWith('/e2b-sandbox') && a.status === 404) ? undefined : 'must be refused with 400';
    const firstIsParam =
      r.url
        .replace(/^\/e2b-sandbox/, '')
        .split('/')[1]
        ?.startsWith(':') === true;
    return a.status === 400 || firstIsParam ? undefined : 'an encoded fixed segment must be refused with 400';
  };

  /** Without a valid credential nothing but a public route answers 2xx or 3xx; the refusal is 401 (400 for a target spelled otherwise). */
  const refusedWithout = (r: { access: Access | undefined; url: string }, a: Answer, variant: string): string | undefined => {
    if (variant !== 'as is') return respelled(r, a, variant);
    if (!needsCredentials(r.access)) return undefined;
    if (r.url === '/e2b-sandbox/health')
      return a.status === 502 ? undefined : 'health without the token must answer 502, as for a sandbox that is not there';
    // E2B's sandbox side: no token is 401; a wrong one answers as a sandbox that is not there (502).
    if (r.access?.kind === 'sandboxToken')
      return a.status === 401 || a.status === 502 ? undefined : 'must be refused (401, or 502 for a wrong token)';
    return a.status === 401 ? undefined : 'must be 401 without credentials';
  };

  test('no key: every route but the public ones answers 401, in every spelling', async () => {
    await walk(control.url, routes, {}, refusedWithout);
  });

  test('a wrong key, and the E2B key header with a wrong key: 401', async () => {
    await walk(control.url, routes, { Authorization: 'Bearer dsec_not-a-key' }, refusedWithout);
    await walk(
      control.url,
      routes,
      { 'X-API-Key': 'e2b_0000000000000000000000000000000000000000', 'X-Access-Token': 'wrong' },
      refusedWithout,
    );
  });

  test("another project's key: the sandbox routes answer as for an unknown sandbox, admin routes 403, cluster routes 401", async () => {
    await walk(control.url, routes, { Authorization: `Bearer ${keyB.key}` }, (r, a, variant) => {
      if (variant !== 'as is') return respelled(r, a, variant);
      const kind = r.access?.kind;
      if (kind === 'admin' || kind === 'clusterOrAdmin')
        return a.status === 403 ? undefined : 'an admin route must answer 403 to a project key';
      if (kind === 'cluster') return a.status === 401 ? undefined : 'a cluster route must answer 401 to an API key';
      if (kind === 'link') return a.status === 401 ? undefined : 'a port link route must refuse a path that is no link';
      if (kind === 'sandboxToken')
        return a.status === 401 || (r.url === '/e2b-sandbox/health' && a.status === 502)
          ? undefined
          : 'the E2B sandbox side takes the sandbox token, not a key';
      if (r.url.startsWith('/v1/sandboxes/:id')) {
        if (r.method === 'DELETE' && r.url === '/v1/sandboxes/:id')
          return a.status === 204 ? undefined : "a kill of another project's sandbox answers 204 and does nothing";
        if (a.status < 300) return "another project's sandbox answered";
      }
      return undefined;
    });
    // The 204 to team-b's kill did nothing: team-a's sandbox still runs.
    const still = await api(keyA.key, 'GET', `/v1/sandboxes/${sandbox.id}`);
    assert.equal((still.body as SandboxInfo).status, 'running');
  });

  test('the cluster token opens the cluster routes only: every API route refuses it', async () => {
    await walk(control.url, routes, { Authorization: `Bearer ${control.joinToken}` }, (r, a, variant) => {
      if (variant !== 'as is') return respelled(r, a, variant);
      const kind = r.access?.kind;
      if (kind === 'key' || kind === 'admin' || kind === 'link') return a.status === 401 ? undefined : 'the cluster token is no API key';
      return undefined;
    });
  });

  test('the edge protocol: every route refuses no token, an API key and a wrong token, in every spelling', async () => {
    const edgeRoutes = declaredRoutes(edge.server);
    assert.ok(edgeRoutes.length > 20, `only ${edgeRoutes.length} edge routes seen`);
    assert.deepEqual(
      edgeRoutes.filter((r) => r.access?.kind !== 'cluster').map((r) => `${r.method} ${r.url}`),
      [],
    );
    const refused = (_r: unknown, a: Answer, variant: string): string | undefined =>
      variant === 'as is'
        ? a.status === 401
          ? undefined
          : 'an edge route must answer 401'
        : a.status === 400 || a.status === 401
          ? undefined
          : 'must be refused';
    for (const headers of [{}, { Authorization: `Bearer ${control.apiKey}` }, { Authorization: 'Bearer dsecjoin_wrong' }] as Record<
      string,
      string
    >[])
      await walk(edge.url, edgeRoutes, headers, refused);
  });

  test('the port-link origin: its one route refuses no link, a forged link and an API key', async () => {
    const portRoutes = declaredRoutes(control.portsApp);
    assert.ok(portRoutes.length > 0);
    assert.deepEqual(
      portRoutes.filter((r) => r.url !== '/v1/port-links/*' || r.access?.kind !== 'link'),
      [],
      'the port-link origin serves links and nothing else',
    );
    const forged = `${sandbox.id}.8000.9999999999.team-a.AAAAAAAAAAAAAAAAAAAAAA`;
    for (const headers of [{}, { Authorization: `Bearer ${control.apiKey}` }] as Record<string, string>[])
      for (const target of [
        '/v1/port-links/x/',
        `/v1/port-links/${forged}/`,
        '/v1/port-links//x',
        `http://x/v1/port-links/${forged}/`,
        '/%761/port-links/x/',
      ])
        for (const method of ['GET', 'POST']) {
          const a = await rawRequest(control.portsUrl, method, target, headers, method === 'POST' ? '{}' : undefined);
          assert.ok(a.status === 401 || a.status === 400 || a.status === 404, `${method} ${target}: ${a.status} ${a.body.slice(0, 200)}`);
        }
  });

  test('generated request targets never reach a 2xx without credentials (fast-check)', async () => {
    const seg = fc.oneof(
      fc.constantFrom(
        'v1',
        'sandboxes',
        sandbox.id,
        'exec',
        'files',
        'cluster',
        'edges',
        'blobs',
        'images',
        'push',
        'pull',
        'nodes',
        'pools',
        'volumes',
        'keys',
        'projects',
        'port-links',
        'ports',
        '8000',
        'e2b',
        'e2b-sandbox',
        'health',
        'ui',
        'metrics',
        'healthz',
        '..',
        '.',
        '',
      ),
      fc.string({ minLength: 1, maxLength: 6 }).map(encodeURIComponent),
      fc.constantFrom('%76%31', '%2F', '%2e%2e', '%73andboxes', 'V1', 'v1%00', ';', '%20'),
    );
    const target = fc
      .tuple(
        fc.constantFrom('', 'http://127.0.0.1', 'http://x', '//'),
        fc.array(seg, { minLength: 1, maxLength: 6 }),
        fc.constantFrom('', '?x=1', '?path=/etc/passwd'),
      )
      .map(([prefix, segs, q]) => `${prefix}/${segs.join('/')}${q}`);
    const method = fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH');
    const e2bHeader = fc.boolean();
    // Public: health, metrics, the dashboard's files, and the redirect of a link path to the port-link origin.
    const publicOk = /^\/(healthz|metrics|ui|v1\/port-links)(\/|$|\?)/;
    await fc.assert(
      fc.asyncProperty(method, target, e2bHeader, async (m, t, e2b) => {
        const a = await rawRequest(control.url, m, t, e2b ? { 'E2b-Sandbox-Id': sandbox.id } : {}, WRITES.has(m) ? '{}' : undefined);
        // envd's /health answers 502 to any refusal, a missing token included (E2B's SDK reads it as
        // "not running": control/e2b/sandbox-routes.ts); every other refusal is a 4xx.
        const envdHealthRefusal = e2b && a.status === 502 && /(^|\/)health(\?[^/]*)?$/.test(t);
        assert.ok(a.status < 500 || envdHealthRefusal, `${m} ${t}: ${a.status} ${a.body.slice(0, 200)}`);
        if (a.status < 400 && !(publicOk.test(t) && !e2b))
          assert.fail(`${m} ${t}${e2b ? ' (E2b-Sandbox-Id)' : ''} answered ${a.status} without credentials: ${a.body.slice(0, 200)}`);
      }),
      { numRuns: 400 },
    );
  });
});
