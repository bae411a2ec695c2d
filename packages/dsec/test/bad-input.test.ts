/** Bad requests: each one answers with the registry status and code in `{error:{code,message,details}}`. */
import assert from 'node:assert/strict';
import { totalmem } from 'node:os';
import { after, before, describe, test } from 'node:test';
import { AuthError, InvalidRequestError, NotFoundError, Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectSdkError, expectWireError } from './helpers/wire.js';

/** Well-formed, but no sandbox has it. */
const UNKNOWN_ID = 'sb-local-0000000000000';

describe('bad input', { skip: integrationSkipReason(), timeout: 180_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let killedId: string;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
    const killed = await Sandbox.create({ ...server.conn });
    killedId = killed.id;
    await killed.kill();
  });
  after(async () => {
    await server?.close();
  });

  const create = (body: unknown) => call(server, 'POST', '/v1/sandboxes', { json: body });
  const exec = (body: unknown, id = sb.id) => call(server, 'POST', `/v1/sandboxes/${id}/exec`, { json: body });

  /** Asserts 400 INVALID_REQUEST naming `field` in details.field. */
  function expectInvalidField(res: Awaited<ReturnType<typeof call>>, field: string): void {
    const e = expectWireError(res, 400, 'INVALID_REQUEST');
    assert.equal(e.details['field'], field, `details.field (message: ${e.message})`);
  }

  // --- create ---------------------------------------------------------------------------------

  test('create with an unknown image: 404 IMAGE_NOT_FOUND naming the image', async () => {
    const e = expectWireError(await create({ image: 'no-such-image' }), 404, 'IMAGE_NOT_FOUND');
    assert.match(e.message, /no-such-image/);
    assert.equal(e.details['image'], 'no-such-image');
    await expectSdkError(Sandbox.create({ ...server.conn, image: 'no-such-image' }), NotFoundError, 'IMAGE_NOT_FOUND');
  });

  test('create with an unknown image id (sha256:…): 404 IMAGE_NOT_FOUND', async () => {
    expectWireError(await create({ image: `sha256:${'0'.repeat(64)}` }), 404, 'IMAGE_NOT_FOUND');
  });

  test('create with an image reference that is not a valid name: 404 IMAGE_NOT_FOUND', async () => {
    expectWireError(await create({ image: '../../etc/passwd' }), 404, 'IMAGE_NOT_FOUND');
  });

  test('an unknown image leaves no sandbox record behind', async () => {
    await create({ image: 'no-such-image', labels: { probe: 'unknown-image' } });
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { probe: 'unknown-image' } }), []);
  });

  test('resources.memoryMiB: 1 → 400 INVALID_REQUEST, field resources.memoryMiB', async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { memoryMiB: 1 } }), 'resources.memoryMiB');
  });

  test('resources.memoryMiB: 64.5 (not an integer) → 400, field resources.memoryMiB', async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { memoryMiB: 64.5 } }), 'resources.memoryMiB');
  });

  test('resources.memoryMiB above the host memory → 400, field resources.memoryMiB', async (t) => {
    const hostMiB = Math.floor(totalmem() / (1 << 20));
    if (hostMiB >= 262144) {
      t.skip(`this host has ${hostMiB} MiB, more than the schema maximum`);
      return;
    }
    const e = expectWireError(await create({ image: 'busybox', resources: { memoryMiB: 262144 } }), 400, 'INVALID_REQUEST');
    assert.equal(e.details['field'], 'resources.memoryMiB');
    assert.match(e.message, /more than any node has/);
  });

  test('resources.cpu: -1 → 400 INVALID_REQUEST, field resources.cpu', async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { cpu: -1 } }), 'resources.cpu');
  });

  test('resources.cpu: 0 → 400, field resources.cpu', async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { cpu: 0 } }), 'resources.cpu');
  });

  test("resources.pids: 'x' → 400 INVALID_REQUEST, field resources.pids", async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { pids: 'x' } }), 'resources.pids');
  });

  test('resources.pids: 4 (below the minimum) → 400, field resources.pids', async () => {
    expectInvalidField(await create({ image: 'busybox', resources: { pids: 4 } }), 'resources.pids');
  });

  test('an unknown field in resources → 400 INVALID_REQUEST, field resources.<name>', async () => {
    const res = await create({ image: 'busybox', resources: { gpus: 1 } });
    expectInvalidField(res, 'resources.gpus');
    assert.match((res.json as { error: { message: string } }).error.message, /not a known field/);
  });

  test('an unknown top-level field → 400 INVALID_REQUEST naming it', async () => {
    expectInvalidField(await create({ image: 'busybox', privileged: true }), 'privileged');
  });

  test('a create without image → 400, field image', async () => {
    expectInvalidField(await create({}), 'image');
  });

  test('backend other than container, microvm or vm → 400, field backend', async () => {
    expectInvalidField(await create({ image: 'busybox', backend: 'firecracker' }), 'backend');
  });

  test('an env name that is not a shell identifier → 400 INVALID_REQUEST', async () => {
    expectWireError(await create({ image: 'busybox', env: { 'BAD-NAME': 'x' } }), 400, 'INVALID_REQUEST');
  });

  test('a label key with forbidden characters → 400 INVALID_REQUEST', async () => {
    expectWireError(await create({ image: 'busybox', labels: { 'bad key!': 'x' } }), 400, 'INVALID_REQUEST');
  });

  test('a body that is not JSON → 400 INVALID_REQUEST', async () => {
    const res = await call(server, 'POST', '/v1/sandboxes', { body: '{"image": "busybox"', contentType: 'application/json' });
    expectWireError(res, 400, 'INVALID_REQUEST');
  });

  test('a JSON body that is not an object → 400 INVALID_REQUEST', async () => {
    expectWireError(await create(['busybox']), 400, 'INVALID_REQUEST');
  });

  test('the SDK maps a 400 to InvalidRequestError with details', async () => {
    // A check only the server makes (the SDK checks the schema before sending).
    const err = await expectSdkError(
      Sandbox.create({ ...server.conn, network: { mode: 'allow', allow: [] } }),
      InvalidRequestError,
      'INVALID_REQUEST',
    );
    assert.equal(err.status, 400);
    assert.equal(err.details['field'], 'allow');
  });

  test('the SDK refuses what the schema refuses before sending: InvalidRequestError naming the field, no status', async () => {
    const err = await expectSdkError(
      Sandbox.create({ ...server.conn, resources: { memoryMiB: 1 } }),
      InvalidRequestError,
      'INVALID_REQUEST',
    );
    assert.equal(err.status, undefined);
    assert.equal(err.details['field'], 'resources.memoryMiB');
  });

  // --- unknown and killed sandboxes -----------------------------------------------------------

  test('exec on an unknown sandbox → 404 SANDBOX_NOT_FOUND', async () => {
    expectWireError(await exec({ cmd: 'true' }, UNKNOWN_ID), 404, 'SANDBOX_NOT_FOUND');
  });

  test('files read and write on an unknown sandbox → 404 SANDBOX_NOT_FOUND', async () => {
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${UNKNOWN_ID}/files?path=/etc/passwd`), 404, 'SANDBOX_NOT_FOUND');
    expectWireError(await call(server, 'PUT', `/v1/sandboxes/${UNKNOWN_ID}/files?path=/tmp/x`, { body: 'x' }), 404, 'SANDBOX_NOT_FOUND');
  });

  test('inspect of an unknown sandbox → 404 SANDBOX_NOT_FOUND; kill of one → 204 (kill is idempotent: gone is gone)', async () => {
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${UNKNOWN_ID}`), 404, 'SANDBOX_NOT_FOUND');
    assert.equal((await call(server, 'DELETE', `/v1/sandboxes/${UNKNOWN_ID}`)).status, 204);
  });

  test('exec on a killed sandbox → 404 SANDBOX_NOT_FOUND', async () => {
    expectWireError(await exec({ cmd: 'true' }, killedId), 404, 'SANDBOX_NOT_FOUND');
  });

  test('files on a killed sandbox → 404 SANDBOX_NOT_FOUND', async () => {
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${killedId}/files?path=/etc/passwd`), 404, 'SANDBOX_NOT_FOUND');
    expectWireError(await call(server, 'PUT', `/v1/sandboxes/${killedId}/files?path=/tmp/x`, { body: 'x' }), 404, 'SANDBOX_NOT_FOUND');
  });

  test('the SDK maps SANDBOX_NOT_FOUND to NotFoundError', async () => {
    await expectSdkError(Sandbox.connect(UNKNOWN_ID, server.conn), NotFoundError, 'SANDBOX_NOT_FOUND');
  });

  // --- auth -----------------------------------------------------------------------------------

  test('no API key → 401 UNAUTHORIZED on every /v1 route', async () => {
    const routes: [string, string][] = [
      ['GET', '/v1/sandboxes'],
      ['POST', '/v1/sandboxes'],
      ['GET', `/v1/sandboxes/${sb.id}`],
      ['DELETE', `/v1/sandboxes/${sb.id}`],
      ['POST', `/v1/sandboxes/${sb.id}/exec`],
      ['GET', `/v1/sandboxes/${sb.id}/files?path=/etc/passwd`],
      ['GET', '/v1/images'],
      ['GET', '/v1/nodes'],
    ];
    for (const [method, path] of routes) {
      const res = await call(server, method, path, { key: null, json: method === 'POST' ? { image: 'busybox', cmd: 'true' } : undefined });
      expectWireError(res, 401, 'UNAUTHORIZED');
    }
    assert.equal((await sb.refresh()).status, 'running', 'the unauthenticated DELETE did nothing');
  });

  test('a wrong API key → 401 UNAUTHORIZED', async () => {
    expectWireError(await call(server, 'GET', '/v1/sandboxes', { key: 'dsec_not-a-real-key' }), 401, 'UNAUTHORIZED');
  });

  test('a non-Bearer Authorization header → 401 UNAUTHORIZED', async () => {
    const res = await fetch(`${server.url}/v1/sandboxes`, { headers: { authorization: `Basic ${server.apiKey}` } });
    assert.equal(res.status, 401);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'UNAUTHORIZED');
  });

  test('the SDK maps 401 to AuthError', async () => {
    await expectSdkError(Sandbox.list({ url: server.url, apiKey: 'wrong' }), AuthError, 'UNAUTHORIZED');
  });

  test('an unauthenticated create does not create a sandbox', async () => {
    await call(server, 'POST', '/v1/sandboxes', { key: null, json: { image: 'busybox', labels: { probe: 'unauth' } } });
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { probe: 'unauth' } }), []);
  });

  // --- size limits ----------------------------------------------------------------------------

  test('PUT files over 64 MiB → 413 PAYLOAD_TOO_LARGE', async () => {
    const body = new Uint8Array(64 * 1024 * 1024 + 1);
    const res = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/huge`, { body });
    expectWireError(res, 413, 'PAYLOAD_TOO_LARGE');
    const r = await sb.commands.run('test -e /tmp/huge');
    assert.equal(r.exitCode, 1, 'nothing was written');
  });

  test('PUT files of exactly 64 MiB is accepted', async () => {
    const body = new Uint8Array(64 * 1024 * 1024);
    const res = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/max`, { body });
    assert.equal(res.status, 200, res.text);
    const r = await sb.commands.run('wc -c < /tmp/max; rm /tmp/max');
    assert.equal(r.stdout.trim(), String(64 * 1024 * 1024));
  });

  test('a JSON body over 16 MiB → 413 PAYLOAD_TOO_LARGE', async () => {
    const res = await exec({ cmd: 'true', stdin: 'x'.repeat(17 * 1024 * 1024) });
    expectWireError(res, 413, 'PAYLOAD_TOO_LARGE');
  });

  // --- path params ----------------------------------------------------------------------------

  test('a sandbox id that could never be one in the path → 400 INVALID_REQUEST saying what ids look like (no regex)', async () => {
    for (const id of ['sb-UPPER-abcdef', '..%2F..%2Fetc', 'sb-local-abcdef%00', 'a_b']) {
      const e = expectWireError(await call(server, 'GET', `/v1/sandboxes/${id}`), 400, 'INVALID_REQUEST');
      assert.match(e.message, /ids look like sb-<edge>-/);
      assert.doesNotMatch(e.message, /\^sb-/, 'the message quotes the pattern');
      expectWireError(await call(server, 'DELETE', `/v1/sandboxes/${id}`), 400, 'INVALID_REQUEST');
      expectWireError(await exec({ cmd: 'true' }, id), 400, 'INVALID_REQUEST');
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${id}/files?path=/etc/passwd`), 400, 'INVALID_REQUEST');
    }
  });

  test('an id of id characters that no sandbox has (a typo, a wrong length) → 404 SANDBOX_NOT_FOUND', async () => {
    for (const id of ['sb-local-nope', 'not-an-id', 'sb-local-ab']) {
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${id}`), 404, 'SANDBOX_NOT_FOUND');
      expectWireError(await exec({ cmd: 'true' }, id), 404, 'SANDBOX_NOT_FOUND');
    }
    await expectSdkError(Sandbox.connect('sb-local-nope', server.conn), NotFoundError, 'SANDBOX_NOT_FOUND');
  });

  test("network mode 'closed' → 400 listing none, allow, open; allow with no entries → 400 naming allow", async () => {
    const bad = expectWireError(
      await call(server, 'PUT', `/v1/sandboxes/${sb.id}/network`, { json: { mode: 'closed' } }),
      400,
      'INVALID_REQUEST',
    );
    assert.match(bad.message, /mode must be one of "none", "allow", "open"/);
    for (const body of [{ mode: 'allow' }, { mode: 'allow', allow: [] }]) {
      const e = expectWireError(await call(server, 'PUT', `/v1/sandboxes/${sb.id}/network`, { json: body }), 400, 'INVALID_REQUEST');
      assert.equal(e.details['field'], 'allow');
      assert.match(e.message, /needs at least one allow entry/);
    }
  });

  test('a cwd that does not exist (or is a file) → 400 naming cwd, not exit 255 with crun text in stderr', async () => {
    for (const [cwd, what] of [
      ['/nope', /does not exist/],
      ['/etc/passwd', /is not a directory/],
    ] as const) {
      const e = expectWireError(await exec({ cmd: 'pwd', cwd }), 400, 'INVALID_REQUEST');
      assert.equal(e.details['field'], 'cwd');
      assert.match(e.message, what);
    }
  });

  test('a file over 64 MiB → 413 stating the limit', async () => {
    const e = expectWireError(
      await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/big`, { body: new Uint8Array((64 << 20) + 1) }),
      413,
      'PAYLOAD_TOO_LARGE',
    );
    assert.match(e.message, /64 MiB limit/);
    assert.equal(e.details['limit'], 64 << 20);
  });

  // --- exec -----------------------------------------------------------------------------------

  test("exec with cmd '' → 400 INVALID_REQUEST", async () => {
    expectWireError(await exec({ cmd: '' }), 400, 'INVALID_REQUEST');
  });

  test('exec with cmd [] → 400 INVALID_REQUEST', async () => {
    expectWireError(await exec({ cmd: [] }), 400, 'INVALID_REQUEST');
  });

  test("exec with cmd [''] (an empty program name) → 400 INVALID_REQUEST", async () => {
    expectWireError(await exec({ cmd: [''] }), 400, 'INVALID_REQUEST');
  });

  test('exec without cmd → 400, field cmd', async () => {
    expectInvalidField(await exec({}), 'cmd');
  });

  test('exec with a negative timeoutMs → 400, field timeoutMs', async () => {
    expectInvalidField(await exec({ cmd: 'true', timeoutMs: -1 }), 'timeoutMs');
  });

  test('exec with timeoutMs 0 → 400, field timeoutMs', async () => {
    expectInvalidField(await exec({ cmd: 'true', timeoutMs: 0 }), 'timeoutMs');
  });

  test('exec with an absurd timeoutMs (10^12) → 400, field timeoutMs', async () => {
    expectInvalidField(await exec({ cmd: 'true', timeoutMs: 1e12 }), 'timeoutMs');
  });

  test("exec with timeoutMs 'soon' → 400, field timeoutMs", async () => {
    expectInvalidField(await exec({ cmd: 'true', timeoutMs: 'soon' }), 'timeoutMs');
  });

  test('exec with a negative maxOutputBytes → 400, field maxOutputBytes', async () => {
    expectInvalidField(await exec({ cmd: 'true', maxOutputBytes: -1 }), 'maxOutputBytes');
  });

  test('exec with maxOutputBytes over 64 MiB → 400, field maxOutputBytes', async () => {
    expectInvalidField(await exec({ cmd: 'true', maxOutputBytes: 64 * 1024 * 1024 + 1 }), 'maxOutputBytes');
  });

  test('exec with a relative cwd → 400, field cwd', async () => {
    expectInvalidField(await exec({ cmd: 'true', cwd: 'tmp' }), 'cwd');
  });

  test('exec with an unknown field → 400 naming it', async () => {
    expectInvalidField(await exec({ cmd: 'true', user: 'root' }), 'user');
  });

  test('exec with a non-string argv element → 400 INVALID_REQUEST', async () => {
    expectWireError(await exec({ cmd: ['echo', { x: 1 }] }), 400, 'INVALID_REQUEST');
  });

  // --- files ----------------------------------------------------------------------------------

  test('files without ?path → 400, field path', async () => {
    expectInvalidField(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files`), 'path');
  });

  test('files with an empty path → 400 INVALID_REQUEST', async () => {
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=`), 400, 'INVALID_REQUEST');
  });

  test('files PUT with a mode that is not octal → 400, field mode', async () => {
    expectInvalidField(await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/m&mode=999`, { body: 'x' }), 'mode');
  });

  test('files with an unknown query parameter → 400 naming it', async () => {
    expectInvalidField(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=/etc/passwd&follow=1`), 'follow');
  });

  // --- list -----------------------------------------------------------------------------------

  test('list with a label filter without "=" → 400 INVALID_REQUEST', async () => {
    expectWireError(await call(server, 'GET', '/v1/sandboxes?label=novalue'), 400, 'INVALID_REQUEST');
  });

  test('list with an unknown status → 400, field status', async () => {
    expectInvalidField(await call(server, 'GET', '/v1/sandboxes?status=sleeping'), 'status');
  });

  test('list with a label filter whose key has a backslash answers (no 500): 200 empty or 400', async () => {
    const res = await call(server, 'GET', `/v1/sandboxes?label=${encodeURIComponent('a\\=b')}`);
    assert.ok(res.status === 200 || res.status === 400, `expected 200 or 400, got ${res.status}: ${res.text}`);
    if (res.status === 200) assert.deepEqual((res.json as { sandboxes: unknown[] }).sandboxes, []);
  });

  test('list with a label filter key containing a quote does not match a different label key', async () => {
    const labelled = await Sandbox.create({ ...server.conn, labels: { ab: 'quoted-filter' } });
    try {
      const res = await call(server, 'GET', `/v1/sandboxes?label=${encodeURIComponent('a"b=quoted-filter')}`);
      assert.ok(res.status === 200 || res.status === 400, `got ${res.status}: ${res.text}`);
      if (res.status === 200) {
        const ids = (res.json as { sandboxes: { id: string }[] }).sandboxes.map((s) => s.id);
        assert.deepEqual(ids, [], 'the filter a"b matched the label ab');
      }
    } finally {
      await labelled.kill();
    }
  });

  // Ajv's coercion made `1e999` Infinity, which passed integer, minimum and maximum: the list
  // answered 500 (its SQL said LIMIT Infinity), the trajectory page too (a red-team pass).
  test('a query number that is not finite (1e999, -1e999, Infinity) → 400 naming it, never a 500', async () => {
    for (const v of ['1e999', '-1e999', 'Infinity']) {
      expectInvalidField(await call(server, 'GET', `/v1/sandboxes?limit=${v}`), 'limit');
      expectInvalidField(await call(server, 'GET', `/v1/sandboxes/${sb.id}/trajectory?limit=${v}`), 'limit');
    }
    assert.equal((await call(server, 'GET', '/v1/sandboxes?limit=2')).status, 200, 'a finite limit still answers');
  });

  // Labels dsec sets and trusts: a batch's spec got past the pool label's check (only single
  // creates made it), and dsec.batch passed anywhere (a red-team pass).
  test('a reserved label (dsec.pool-ready, dsec.batch) in a create or a batch spec → 400 naming it; nothing is made', async () => {
    const before = ((await call(server, 'GET', '/v1/sandboxes')).json as { sandboxes: unknown[] }).sandboxes.length;
    for (const label of ['dsec.pool-ready', 'dsec.batch']) {
      const labels = { [label]: 'p1' };
      expectInvalidField(await create({ image: 'busybox', labels }), `labels.${label}`);
      expectInvalidField(
        await call(server, 'POST', '/v1/batches', { json: { count: 1, spec: { image: 'busybox', labels } } }),
        `labels.${label}`,
      );
    }
    const after = ((await call(server, 'GET', '/v1/sandboxes')).json as { sandboxes: unknown[] }).sandboxes.length;
    assert.equal(after, before, 'no sandbox was made');
  });

  // --- routes ---------------------------------------------------------------------------------

  test('an unknown route → 404 ROUTE_NOT_FOUND', async () => {
    expectWireError(await call(server, 'GET', '/v1/nope'), 404, 'ROUTE_NOT_FOUND');
    expectWireError(await call(server, 'GET', '/nope', { key: null }), 404, 'ROUTE_NOT_FOUND');
  });

  test('a known path with a wrong method → 404 ROUTE_NOT_FOUND', async () => {
    expectWireError(await call(server, 'PATCH', `/v1/sandboxes/${sb.id}`, { json: {} }), 404, 'ROUTE_NOT_FOUND');
  });

  test('after all the bad input the sandbox still works', async () => {
    const r = await sb.commands.run('echo fine');
    assert.equal(r.stdout, 'fine\n');
  });
});
