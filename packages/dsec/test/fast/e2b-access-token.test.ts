/**
 * E2B's envd access token, in process (support/in-process-control.ts): the E2B API gives it to a
 * key of the sandbox's project, envd's routes take it, and dsec's own API never shows it (not in
 * labels, which `dsec ps`, GET /v1/sandboxes and the dashboard list, nor in the stored spec that
 * forks and replays copy).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { startInProcessControl, type InProcessControl } from './support/in-process-control.js';

describe('fast tier: the E2B access token stays out of labels', () => {
  let dsec: InProcessControl;
  before(async () => {
    dsec = await startInProcessControl();
  });
  after(async () => {
    await dsec?.close();
  });

  const e2b = (method: string, url: string, key: string, body?: object) =>
    dsec.app.inject({ method: method as 'GET', url, headers: { 'x-api-key': key }, ...(body ? { payload: body } : {}) });

  test('the create answers the token; GET /v1/sandboxes, the sandbox and its spec do not hold it; envd takes it', async () => {
    const { keys, call } = dsec;
    const made = await e2b('POST', '/sandboxes', keys.a, { templateID: 'busybox', metadata: { run: 'r1' } });
    assert.equal(made.statusCode, 201, made.body);
    const { sandboxID: id, envdAccessToken: token } = made.json() as { sandboxID: string; envdAccessToken: string };
    assert.match(token, /^[0-9a-f]{48}$/);

    const listed = await call('GET', '/v1/sandboxes', keys.a);
    assert.equal(listed.statusCode, 200);
    assert.ok(!listed.body.includes(token), 'GET /v1/sandboxes shows no token');
    const admin = await call('GET', '/v1/sandboxes', keys.admin);
    assert.ok(!admin.body.includes(token), "nor an admin's list");
    const one = await call('GET', `/v1/sandboxes/${id}`, keys.a);
    assert.ok(!one.body.includes(token), one.body);
    const info = one.json() as SandboxInfo;
    assert.equal(info.labels['e2b.template'], 'busybox', 'the E2B labels that are not secrets stay');
    assert.equal(info.labels['e2b.access-token'], undefined);
    assert.ok(!JSON.stringify(await dsec.store.sandboxes.spec(id)).includes(token), 'the stored spec (forks, replays) has no token');

    // E2B's API gives it to a key of the project, as E2B's does, and only there.
    const detail = await e2b('GET', `/sandboxes/${id}`, keys.a);
    assert.equal(detail.statusCode, 200, detail.body);
    assert.equal((detail.json() as { envdAccessToken: string }).envdAccessToken, token);
    const list = (await e2b('GET', '/sandboxes', keys.a)).json() as { sandboxID: string; envdAccessToken: string }[];
    assert.deepEqual(
      list.map((s) => [s.sandboxID, s.envdAccessToken]),
      [[id, token]],
    );
    assert.equal((await e2b('GET', `/sandboxes/${id}`, keys.b)).statusCode, 404, "another project's key");
    assert.deepEqual((await e2b('GET', '/sandboxes', keys.b)).json(), []);
    const connected = await e2b('POST', `/sandboxes/${id}/connect`, keys.a, { timeout: 60 });
    assert.equal((connected.json() as { envdAccessToken: string }).envdAccessToken, token, connected.body);

    // envd's side takes the token from its column: the right one opens the sandbox, another does not.
    const health = (t: string) =>
      dsec.app.inject({ method: 'GET', url: '/health', headers: { 'e2b-sandbox-id': id, 'x-access-token': t } });
    assert.ok((await health(token)).statusCode < 300, (await health(token)).body);
    assert.equal((await health('0'.repeat(48))).statusCode, 502);

    // A sandbox made through dsec's API with the old label by hand is no E2B sandbox: a label opens nothing.
    const forged = await call('POST', '/v1/sandboxes', keys.a, { image: 'busybox', labels: { 'e2b.access-token': 'forged' } });
    assert.equal(forged.statusCode, 201, forged.body);
    const forgedId = (forged.json() as SandboxInfo).id;
    assert.equal(
      (await dsec.app.inject({ method: 'GET', url: '/health', headers: { 'e2b-sandbox-id': forgedId, 'x-access-token': 'forged' } }))
        .statusCode,
      502,
    );
    assert.equal((await e2b('GET', `/sandboxes/${forgedId}`, keys.a)).statusCode, 404);

    for (const s of [id, forgedId]) assert.equal((await call('DELETE', `/v1/sandboxes/${s}`, keys.a)).statusCode, 204);
  });
});
