/**
 * Projects, keys and quotas against a real server (crun sandboxes): one project cannot see or
 * touch another's sandboxes, batches, trajectories or private images through any route (dsec's
 * /v1 and E2B's), quotas refuse with the code that names them, and a revoked key is a 401.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { QuotaError, RateLimitError, Sandbox } from '@dsec/sdk';
import type { BatchEvent, CreatedKey, ProjectInfo, SandboxInfo } from '@dsec/sdk/schema';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const CLI = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));

interface Answer {
  status: number;
  body: Record<string, unknown> & { error?: { code: string; message: string; details: Record<string, unknown> } };
  text: string;
}

describe('projects, keys and quotas', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let admin: string;
  let keyA: CreatedKey;
  let keyB: CreatedKey;
  let sbA: Sandbox;

  const call = async (key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Answer> => {
    const res = await fetch(`${server.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    let parsed: Answer['body'] = {};
    try {
      parsed = text ? (JSON.parse(text) as Answer['body']) : {};
    } catch {
      // NDJSON or empty: the text is there for the caller
    }
    return { status: res.status, body: parsed, text };
  };
  const ok = async (key: string, method: string, path: string, body?: unknown): Promise<Answer['body']> => {
    const a = await call(key, method, path, body);
    assert.ok(a.status < 300, `${method} ${path}: ${a.status} ${a.text}`);
    return a.body;
  };
  const project = async (name: string, quota: Record<string, number> = {}): Promise<CreatedKey> => {
    await ok(admin, 'POST', '/v1/projects', { name, quota });
    return (await ok(admin, 'POST', '/v1/keys', { project: name, name: `${name} test key` })) as unknown as CreatedKey;
  };
  const connA = (): { url: string; apiKey: string } => ({ url: server.url, apiKey: keyA.key });

  before(async () => {
    server = await startTestServer();
    admin = server.apiKey;
    keyA = await project('team-a');
    keyB = await project('team-b');
    sbA = await Sandbox.create({ ...connA(), labels: { job: 'shared-label' } });
    const wrote = await sbA.commands.run('echo secret-of-a > /tmp/a.txt');
    assert.equal(wrote.exitCode, 0, wrote.stderr);
  });
  after(async () => {
    await server?.close();
  });

  test('the bootstrap key is an admin key of project default; new keys carry their project', async () => {
    const { keys } = (await ok(admin, 'GET', '/v1/keys')) as { keys: { id: string; name: string; project: string; admin: boolean }[] };
    assert.ok(keys.some((k) => k.name === 'client.json' && k.project === 'default' && k.admin));
    assert.ok(keys.some((k) => k.id === keyA.id && k.project === 'team-a' && !k.admin));
    const info = (await ok(keyA.key, 'GET', `/v1/sandboxes/${sbA.id}`)) as unknown as SandboxInfo;
    assert.equal(info.project, 'team-a');
  });

  test("another project's sandbox answers exactly as a sandbox that does not exist (404), on every route", async () => {
    const missing = `sb-${server.edgeId}-zzzzzzzzzzzz`;
    const routes: [string, string, unknown?][] = [
      ['GET', '/v1/sandboxes/{id}'],
      ['DELETE', '/v1/sandboxes/{id}'],
      ['POST', '/v1/sandboxes/{id}/exec', { cmd: 'cat /tmp/a.txt' }],
      ['POST', '/v1/sandboxes/{id}/sessions', {}],
      ['POST', '/v1/sandboxes/{id}/processes', { cmd: 'sleep 1' }],
      ['GET', '/v1/sandboxes/{id}/processes'],
      ['GET', '/v1/sandboxes/{id}/files?path=/tmp/a.txt'],
      ['GET', '/v1/sandboxes/{id}/files/list?path=/tmp'],
      ['POST', '/v1/sandboxes/{id}/pause'],
      ['POST', '/v1/sandboxes/{id}/snapshot', {}],
      ['POST', '/v1/sandboxes/{id}/fork', { count: 1 }],
      ['PUT', '/v1/sandboxes/{id}/network', { mode: 'open' }],
      ['GET', '/v1/sandboxes/{id}/trajectory'],
      ['POST', '/v1/sandboxes/{id}/replay'],
    ];
    for (const [method, path, body] of routes) {
      const theirs = await call(keyB.key, method, path.replace('{id}', sbA.id), body);
      const none = await call(keyB.key, method, path.replace('{id}', missing), body);
      assert.equal(theirs.status, none.status, `${method} ${path}: the status tells the two apart: ${theirs.text} / ${none.text}`);
      assert.equal(
        theirs.body.error?.message,
        none.body.error?.message?.replace(missing, sbA.id),
        `${method} ${path}: the answer tells the two apart`,
      );
      if (method === 'DELETE') {
        // Kills are idempotent: an unknown id's kill succeeds, and so (doing nothing) does this one.
        assert.equal(theirs.status, 204);
        continue;
      }
      assert.equal(theirs.status, 404, `${method} ${path} on another project's sandbox: ${theirs.status} ${theirs.text}`);
      assert.equal(theirs.body.error?.code, 'SANDBOX_NOT_FOUND', `${method} ${path}`);
    }
    // Nothing B tried happened: A's sandbox runs, unpaused, with its file, and no fork or snapshot.
    const info = await sbA.refresh();
    assert.equal(info.status, 'running');
    const read = await sbA.commands.run('cat /tmp/a.txt');
    assert.equal(read.stdout, 'secret-of-a\n', JSON.stringify(read));
    const { entries } = await sbA.trajectory();
    assert.ok(!entries.some((e) => e.kind === 'pause' || e.kind === 'network.set'), 'a step of B reached the log of A');
  });

  test("a terminal cannot be attached to another project's sandbox", async () => {
    const status = await new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/sandboxes/${sbA.id}/pty`, {
        headers: { authorization: `Bearer ${keyB.key}` },
      });
      ws.once('open', () => {
        ws.close();
        reject(new Error("B's terminal into A's sandbox opened"));
      });
      ws.once('unexpected-response', (_req, res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      ws.once('error', reject);
    });
    assert.equal(status, 404);
  });

  test("lists and bulk routes show and touch only the caller's project; an admin key sees all", async () => {
    const listOf = async (key: string, q = ''): Promise<string[]> =>
      ((await ok(key, 'GET', `/v1/sandboxes${q}`)) as { sandboxes: SandboxInfo[] }).sandboxes.map((s) => s.id);
    assert.ok((await listOf(keyA.key)).includes(sbA.id));
    assert.ok(!(await listOf(keyB.key)).includes(sbA.id));
    assert.ok(!(await listOf(keyB.key, '?project=team-a')).includes(sbA.id), 'a project key cannot widen its list with ?project=');
    assert.ok((await listOf(admin)).includes(sbA.id));
    assert.ok((await listOf(admin, '?project=team-a')).includes(sbA.id));
    assert.ok(!(await listOf(admin, '?project=team-b')).includes(sbA.id));
    for (const action of ['pause', 'kill']) {
      const r = (await ok(keyB.key, 'POST', `/v1/sandboxes/${action}`, { labels: { job: 'shared-label' } })) as { ids: string[] };
      assert.deepEqual(r.ids, [], `B's bulk ${action} reached A's sandbox`);
    }
    assert.equal((await sbA.refresh()).status, 'running');
  });

  test("batches: another project's batch is BATCH_NOT_FOUND; its sandboxes are the batch project's", async () => {
    const batch = await ok(keyA.key, 'POST', '/v1/batches', { count: 1, spec: { image: 'busybox' } });
    const id = batch['id'] as string;
    const events = await call(keyA.key, 'GET', `/v1/batches/${id}/events`);
    const lines = events.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as BatchEvent);
    const sandboxId = lines.find((e) => e.type === 'running')?.sandboxId;
    assert.ok(sandboxId, events.text);
    for (const [method, path] of [
      ['GET', `/v1/batches/${id}`],
      ['GET', `/v1/batches/${id}/events`],
      ['DELETE', `/v1/batches/${id}`],
    ] as const) {
      const a = await call(keyB.key, method, path);
      assert.equal(a.status, 404, `${method} ${path}`);
      assert.equal(a.body.error?.code, 'BATCH_NOT_FOUND');
    }
    // The list (the dashboard's batches page) is scoped the same way; an admin key sees every project's.
    const listed = async (key: string): Promise<string[]> =>
      ((await ok(key, 'GET', '/v1/batches')) as { batches: { id: string }[] }).batches.map((b) => b.id);
    assert.ok((await listed(keyA.key)).includes(id));
    assert.ok(!(await listed(keyB.key)).includes(id), "team-b's list has team-a's batch");
    assert.ok((await listed(admin)).includes(id));
    assert.equal(((await ok(keyA.key, 'GET', `/v1/sandboxes/${sandboxId}`)) as unknown as SandboxInfo).project, 'team-a');
    await ok(keyA.key, 'DELETE', `/v1/sandboxes/${sandboxId}`);
  });

  test("images: a project's snapshot is its own; shared images stay shared; names cannot be taken over", async () => {
    const snap = (await ok(keyA.key, 'POST', `/v1/sandboxes/${sbA.id}/snapshot`, { name: 'a-private' })) as { imageId: string };
    const imagesOf = async (key: string): Promise<{ id: string; names: string[] }[]> =>
      ((await ok(key, 'GET', '/v1/images')) as { images: { id: string; names: string[] }[] }).images;
    assert.ok((await imagesOf(keyA.key)).some((i) => i.id === snap.imageId && i.names.includes('a-private:latest')));
    assert.ok(!(await imagesOf(keyB.key)).some((i) => i.id === snap.imageId), "B lists A's private image");
    assert.ok(
      (await imagesOf(keyB.key)).some((i) => i.names.includes('busybox:latest')),
      'B does not see the shared base image',
    );
    for (const ref of ['a-private', snap.imageId]) {
      const get = await call(keyB.key, 'GET', `/v1/images/${ref}`);
      assert.equal(get.body.error?.code, 'IMAGE_NOT_FOUND', `GET ${ref}`);
      const create = await call(keyB.key, 'POST', '/v1/sandboxes', { image: ref });
      assert.equal(create.body.error?.code, 'IMAGE_NOT_FOUND', `create from ${ref}: ${create.text}`);
      const del = await call(keyB.key, 'DELETE', `/v1/images/${ref}`);
      assert.equal(del.body.error?.code, 'IMAGE_NOT_FOUND', `DELETE ${ref}`);
    }
    const sbB = await Sandbox.create({ url: server.url, apiKey: keyB.key });
    try {
      for (const name of ['a-private', 'busybox']) {
        const taken = await call(keyB.key, 'POST', `/v1/sandboxes/${sbB.id}/snapshot`, { name });
        assert.equal(taken.status, 409, taken.text);
        assert.equal(taken.body.error?.code, 'IMAGE_NAME_TAKEN');
      }
      assert.equal(((await ok(keyA.key, 'GET', '/v1/images/busybox')) as { names: string[] }).names.includes('busybox:latest'), true);
      const shared = await call(keyB.key, 'DELETE', '/v1/images/busybox');
      assert.equal(shared.status, 403);
      assert.equal(shared.body.error?.code, 'FORBIDDEN');
      const build = await call(keyB.key, 'POST', '/v1/images', { builder: 'busybox' });
      assert.equal(build.body.error?.code, 'FORBIDDEN');
    } finally {
      await sbB.kill();
    }
    // A starts from its own image, then deletes it.
    const fromSnap = await Sandbox.create({ ...connA(), image: 'a-private' });
    assert.equal((await fromSnap.commands.run('cat /tmp/a.txt')).stdout, 'secret-of-a\n');
    await fromSnap.kill();
    await ok(keyA.key, 'DELETE', `/v1/images/${snap.imageId}`);
    assert.equal((await call(keyA.key, 'GET', '/v1/images/a-private')).status, 404);
  });

  test("E2B's API: another project's sandbox is not found, not listed, not killed; creates land in the key's project", async () => {
    const e2bA = (await ok(keyA.key, 'POST', '/v1/e2b/keys', { name: 'a' })) as { key: string };
    const e2bB = (await ok(keyB.key, 'POST', '/v1/e2b/keys', { name: 'b' })) as { key: string };
    const e2b = async (key: string, method: string, path: string, body?: unknown): Promise<Answer> =>
      call('', method, path, body, { 'x-api-key': key, authorization: '' });
    const made = await e2b(e2bA.key, 'POST', '/sandboxes', { templateID: 'busybox', timeout: 300 });
    assert.equal(made.status, 201, made.text);
    const id = made.body['sandboxID'] as string;
    try {
      assert.equal(((await ok(keyA.key, 'GET', `/v1/sandboxes/${id}`)) as unknown as SandboxInfo).project, 'team-a');
      assert.equal((await e2b(e2bB.key, 'GET', `/sandboxes/${id}`)).status, 404);
      assert.equal((await e2b(e2bB.key, 'POST', `/sandboxes/${id}/timeout`, { timeout: 1 })).status, 404);
      assert.equal((await e2b(e2bB.key, 'DELETE', `/sandboxes/${id}`)).status, 404);
      const listB = (await e2b(e2bB.key, 'GET', '/v2/sandboxes')).body as unknown as { sandboxID: string }[];
      assert.ok(!listB.some((s) => s.sandboxID === id));
      const listA = (await e2b(e2bA.key, 'GET', '/v2/sandboxes')).body as unknown as { sandboxID: string }[];
      assert.ok(listA.some((s) => s.sandboxID === id));
      assert.equal((await e2b(e2bA.key, 'GET', `/sandboxes/${id}`)).status, 200);
    } finally {
      assert.equal((await e2b(e2bA.key, 'DELETE', `/sandboxes/${id}`)).status, 204);
    }
  });

  test("a killed sandbox's trajectory stays readable by its project only", async () => {
    const sb = await Sandbox.create(connA());
    await sb.commands.run('echo done');
    await sb.kill();
    assert.equal((await call(keyA.key, 'GET', `/v1/sandboxes/${sb.id}/trajectory`)).status, 200);
    const theirs = await call(keyB.key, 'GET', `/v1/sandboxes/${sb.id}/trajectory`);
    assert.equal(theirs.status, 404);
    assert.equal(theirs.body.error?.message, `no sandbox ${sb.id}`, 'the answer says when A killed it');
  });

  test('quotas on count, CPU and memory refuse with 403 and the code naming the quota', async () => {
    const small = await project('small', { maxSandboxes: 1 });
    const conn = { url: server.url, apiKey: small.key };
    const first = await Sandbox.create({ ...conn, resources: { cpu: 0.5, memoryMiB: 64 } });
    try {
      await assert.rejects(Sandbox.create(conn), (err: unknown) => {
        assert.ok(err instanceof QuotaError && !(err instanceof RateLimitError), String(err));
        assert.equal(err.status, 403);
        assert.equal(err.code, 'QUOTA_SANDBOXES_EXCEEDED');
        assert.deepEqual([err.details['quota'], err.details['limit'], err.details['used']], ['maxSandboxes', 1, 1]);
        return true;
      });
      // A fork that cannot fit is refused before its snapshot is taken.
      const fork = await call(small.key, 'POST', `/v1/sandboxes/${first.id}/fork`, { count: 2 });
      assert.equal(fork.body.error?.code, 'QUOTA_SANDBOXES_EXCEEDED', fork.text);
      // A batch that could never fit is refused as a whole.
      const batch = await call(small.key, 'POST', '/v1/batches', { count: 2, spec: { image: 'busybox' } });
      assert.equal(batch.status, 403);
      assert.equal(batch.body.error?.code, 'QUOTA_SANDBOXES_EXCEEDED');
      // E2B's create keeps the code beside E2B's error shape.
      const e2bKey = (await ok(small.key, 'POST', '/v1/e2b/keys', {})) as { key: string };
      const e2b = await call('', 'POST', '/sandboxes', { templateID: 'busybox' }, { 'x-api-key': e2bKey.key, authorization: '' });
      assert.equal(e2b.status, 403);
      assert.equal((e2b.body['error'] as { code: string }).code, 'QUOTA_SANDBOXES_EXCEEDED');

      await ok(admin, 'PATCH', '/v1/projects/small', { quota: { maxCpu: 1, maxMemoryMiB: 100 }, clear: ['maxSandboxes'] });
      const cpu = await call(small.key, 'POST', '/v1/sandboxes', { image: 'busybox', resources: { cpu: 1, memoryMiB: 16 } });
      assert.equal(cpu.status, 403);
      assert.equal(cpu.body.error?.code, 'QUOTA_CPU_EXCEEDED');
      const mem = await call(small.key, 'POST', '/v1/sandboxes', { image: 'busybox', resources: { cpu: 0.25, memoryMiB: 64 } });
      assert.equal(mem.status, 403);
      assert.equal(mem.body.error?.code, 'QUOTA_MEMORY_EXCEEDED');
      const info = (await ok(small.key, 'GET', '/v1/projects/small')) as unknown as ProjectInfo;
      assert.deepEqual(info.quota, { maxCpu: 1, maxMemoryMiB: 100 });
      assert.deepEqual(info.usage, { sandboxes: 1, cpu: 0.5, memoryMiB: 64 });
      // Items of a batch that do not fit when their turn comes fail with the quota's code.
      await ok(admin, 'PATCH', '/v1/projects/small', { quota: { maxSandboxes: 2 }, clear: ['maxCpu', 'maxMemoryMiB'] });
      const fits = await ok(small.key, 'POST', '/v1/batches', { count: 2, spec: { image: 'busybox', resources: { memoryMiB: 16 } } });
      const events = (await call(small.key, 'GET', `/v1/batches/${fits['id'] as string}/events`)).text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as BatchEvent);
      const running = events.filter((e) => e.type === 'running');
      const failed = events.filter((e) => e.type === 'failed');
      assert.equal(running.length, 1, JSON.stringify(events));
      assert.deepEqual(
        failed.map((e) => e.code),
        ['QUOTA_SANDBOXES_EXCEEDED'],
      );
      await ok(small.key, 'DELETE', `/v1/sandboxes/${running[0]!.sandboxId!}`);
    } finally {
      await first.kill();
    }
  });

  test("a warm pool's claim moves the sandbox into the claiming project, within its quota", async () => {
    const denied = await call(keyA.key, 'POST', '/v1/pools', { name: 'not-mine', size: 1, image: 'busybox' });
    assert.equal(denied.body.error?.code, 'FORBIDDEN');
    await ok(admin, 'POST', '/v1/pools', { name: 'shared-pool', size: 1, image: 'busybox', resources: { memoryMiB: 32 } });
    try {
      const ready = async (): Promise<void> => {
        for (;;) {
          const p = (await ok(admin, 'GET', '/v1/pools/shared-pool')) as {
            ready: number;
            creating: number;
            refillFailures: number;
            lastRefillError?: string;
          };
          if (p.ready >= 1 && p.creating === 0) return;
          if (p.refillFailures > 0) throw new Error(`the pool failed to refill: ${p.lastRefillError}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      await ready();
      // A project with no room left cannot claim: the claim is a create for its quota.
      const none = await project('no-room', { maxSandboxes: 0 });
      const refused = await call(none.key, 'POST', '/v1/sandboxes', {
        image: 'busybox',
        pool: 'shared-pool',
        resources: { memoryMiB: 32 },
      });
      assert.equal(refused.body.error?.code, 'QUOTA_SANDBOXES_EXCEEDED', refused.text);
      const claimed = (await ok(keyB.key, 'POST', '/v1/sandboxes', {
        image: 'busybox',
        pool: 'shared-pool',
        resources: { memoryMiB: 32 },
      })) as unknown as SandboxInfo;
      assert.equal(claimed.labels['dsec.pool'], 'shared-pool', 'not served from the pool');
      assert.equal(claimed.project, 'team-b');
      assert.equal((await call(keyA.key, 'GET', `/v1/sandboxes/${claimed.id}`)).status, 404);
      assert.equal(((await ok(keyB.key, 'GET', '/v1/projects/team-b')) as unknown as ProjectInfo).usage.sandboxes, 1);
      await ok(keyB.key, 'DELETE', `/v1/sandboxes/${claimed.id}`);
    } finally {
      await ok(admin, 'DELETE', '/v1/pools/shared-pool');
    }
  });

  test('the create rate refuses with 429 QUOTA_CREATE_RATE_EXCEEDED and says when to retry', async () => {
    // One create per 1,000 s: the bucket holds one; the second create finds it empty.
    const slow = await project('slow', { createsPerSecond: 0.001 });
    const conn = { url: server.url, apiKey: slow.key };
    const sb = await Sandbox.create(conn);
    try {
      await assert.rejects(Sandbox.create(conn), (err: unknown) => {
        assert.ok(err instanceof RateLimitError, String(err));
        assert.equal(err.status, 429);
        assert.equal(err.code, 'QUOTA_CREATE_RATE_EXCEEDED');
        assert.ok((err.details['retryAfterMs'] as number) > 0);
        return true;
      });
    } finally {
      await sb.kill();
    }
  });

  test('project and key management take an admin key; a revoked key gets 401', async () => {
    for (const [method, path, body] of [
      ['POST', '/v1/projects', { name: 'sneaky' }],
      ['PATCH', '/v1/projects/team-a', { quota: { maxSandboxes: 0 } }],
      ['POST', '/v1/keys', { project: 'team-a', admin: true }],
      ['GET', '/v1/keys'],
      ['DELETE', `/v1/keys/${keyB.id}`],
      ['POST', `/v1/nodes/${server.edgeId}/drain`],
      ['POST', '/v1/images/gc'],
    ] as [string, string, unknown?][]) {
      const a = await call(keyA.key, method, path, body);
      assert.equal(a.status, 403, `${method} ${path}: ${a.text}`);
      assert.equal(a.body.error?.code, 'FORBIDDEN');
    }
    // A project key reads its own project only.
    assert.deepEqual(
      ((await ok(keyA.key, 'GET', '/v1/projects')) as { projects: ProjectInfo[] }).projects.map((p) => p.name),
      ['team-a'],
    );
    assert.equal((await call(keyA.key, 'GET', '/v1/projects/team-b')).body.error?.code, 'PROJECT_NOT_FOUND');
    assert.equal((await call(admin, 'POST', '/v1/projects', { name: 'team-a' })).body.error?.code, 'PROJECT_EXISTS');
    assert.equal((await call(admin, 'POST', '/v1/keys', { project: 'nope' })).body.error?.code, 'PROJECT_NOT_FOUND');

    const spare = (await ok(admin, 'POST', '/v1/keys', { project: 'team-a', name: 'spare' })) as unknown as CreatedKey;
    assert.equal((await call(spare.key, 'GET', '/v1/sandboxes')).status, 200);
    assert.equal((await call(admin, 'DELETE', `/v1/keys/${spare.id}`)).status, 204);
    const revoked = await call(spare.key, 'GET', '/v1/sandboxes');
    assert.equal(revoked.status, 401);
    assert.equal(revoked.body.error?.code, 'UNAUTHORIZED');
    assert.equal((await call(admin, 'DELETE', '/v1/keys/key_000000000000')).body.error?.code, 'KEY_NOT_FOUND');
  });

  test('the CLI: dsec project create|ls|set-quota, dsec key create|ls|revoke', async () => {
    const run = (args: string[], key = admin): Promise<{ code: number | null; stdout: string; stderr: string }> =>
      new Promise((resolve, reject) => {
        const child = spawn(process.execPath, [CLI, ...args], {
          env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', DSEC_URL: server.url, DSEC_API_KEY: key },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let stdout = '';
        let stderr = '';
        child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
        child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
        child.on('error', reject);
        child.on('close', (code) => resolve({ code, stdout, stderr }));
      });
    const created = await run(['project', 'create', 'cli-team', '--sandboxes', '3', '--rate', '5']);
    assert.equal(created.code, 0, created.stderr);
    assert.match(created.stdout, /project cli-team created \(quota: sandboxes 3, rate 5\/s\)/);
    const set = await run(['project', 'set-quota', 'cli-team', '--cpu', '2', '--clear', 'rate']);
    assert.equal(set.code, 0, set.stderr);
    assert.match(set.stdout, /quota sandboxes 3, cpu 2$/m);
    const ls = await run(['project', 'ls', '--json']);
    const listed = (JSON.parse(ls.stdout) as ProjectInfo[]).find((p) => p.name === 'cli-team');
    assert.deepEqual(listed?.quota, { maxSandboxes: 3, maxCpu: 2 });
    const key = await run(['key', 'create', '--project', 'cli-team', '--name', 'trainer', '--json']);
    assert.equal(key.code, 0, key.stderr);
    const k = JSON.parse(key.stdout) as CreatedKey;
    assert.equal(k.project, 'cli-team');
    const own = await run(['project', 'ls', '--json'], k.key);
    assert.deepEqual(
      (JSON.parse(own.stdout) as ProjectInfo[]).map((p) => p.name),
      ['cli-team'],
    );
    const denied = await run(['project', 'create', 'x'], k.key);
    assert.equal(denied.code, 1);
    assert.match(denied.stderr, /takes an admin key.*\(FORBIDDEN\)/);
    const keys = await run(['key', 'ls', '--project', 'cli-team', '--json']);
    assert.deepEqual(
      (JSON.parse(keys.stdout) as { id: string }[]).map((r) => r.id),
      [k.id],
    );
    const revoke = await run(['key', 'revoke', k.id]);
    assert.equal(revoke.code, 0, revoke.stderr);
    const after = await run(['ps'], k.key);
    assert.equal(after.code, 1);
    assert.match(after.stderr, /UNAUTHORIZED/);
    // Once projects are in use, ps names each row's project.
    const ps = await run(['ps']);
    assert.equal(ps.code, 0, ps.stderr);
    assert.match(ps.stdout, /^\s*ID\s+PROJECT\s+STATUS/m);
    assert.match(ps.stdout, new RegExp(`${sbA.id}\\s+team-a\\s+running`));
    const bad = await run(['project', 'set-quota', 'cli-team', '--clear', 'disk']);
    assert.equal(bad.code, 1);
    assert.doesNotMatch(bad.stderr, /^\s+at /m);
  });
});
