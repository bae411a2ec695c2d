/**
 * Named volumes through a real all-in-one dsec: created, mounted read-write into one sandbox and
 * read-only into another (crun bind mounts, nosuid and nodev), kept when sandboxes are killed,
 * refused deletion while mounted, sized, deleted; bad mounts are 4xx before anything is made.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ConflictError, InvalidRequestError, NotFoundError, Sandbox, Volume } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const CLI = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));

describe('volumes', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let conn: { url: string; apiKey: string };
  const spec = { resources: { memoryMiB: 64 } };

  before(async () => {
    server = await startTestServer();
    conn = server.conn;
  });
  after(async () => {
    await server?.close();
  });

  test('a volume outlives the sandbox that wrote it; another mounts it read-only; delete waits for the last mount', async () => {
    const v = await Volume.create('dataset', { ...conn, labels: { kind: 'data' } });
    assert.equal(v.info.edge, server.edgeId);
    assert.deepEqual(v.info.mountedBy, []);
    await assert.rejects(Volume.create('dataset', conn), (e: unknown) => e instanceof ConflictError && e.code === 'VOLUME_EXISTS');

    const writer = await Sandbox.create({ ...conn, ...spec, volumes: [{ name: 'dataset', path: '/data' }] });
    const w = await writer.commands.run(
      'echo rows > /data/train.csv && mkdir -p /data/sub && head -c 100000 /dev/zero > /data/sub/blob && cat /data/train.csv',
    );
    assert.equal(w.exitCode, 0, w.stderr);
    assert.equal(w.stdout, 'rows\n');
    // The mount is nosuid and nodev, whatever the volume holds.
    const opts = (await writer.commands.run("grep ' /data ' /proc/mounts")).stdout;
    assert.match(opts, /\bnosuid\b/);
    assert.match(opts, /\bnodev\b/);
    assert.match(opts, /\brw\b/);
    assert.deepEqual((await Volume.get('dataset', conn)).info.mountedBy, [writer.id]);
    await writer.kill();

    const reader = await Sandbox.create({ ...conn, ...spec, volumes: [{ name: 'dataset', path: '/mnt/ds', readOnly: true }] });
    assert.equal((await reader.commands.run('cat /mnt/ds/train.csv')).stdout, 'rows\n', 'the data survived the kill');
    const denied = await reader.commands.run('(echo x > /mnt/ds/new) 2>&1; echo "exit $?"');
    assert.match(denied.stdout, /Read-only file system/);
    assert.match(denied.stdout, /exit 1/);
    assert.doesNotMatch((await reader.commands.run('ls /mnt/ds')).stdout, /new/);

    const sized = await Volume.get('dataset', conn);
    assert.ok(sized.info.bytes !== undefined && sized.info.bytes >= 100_005, `size ${sized.info.bytes}`);
    await assert.rejects(
      sized.delete(),
      (e: unknown) => e instanceof ConflictError && e.code === 'VOLUME_IN_USE' && e.message.includes(reader.id),
    );
    assert.ok((await Volume.list(conn)).some((x) => x.name === 'dataset' && x.info.mountedBy.includes(reader.id)));

    await reader.kill();
    await sized.delete();
    await assert.rejects(Volume.get('dataset', conn), (e: unknown) => e instanceof NotFoundError && e.code === 'VOLUME_NOT_FOUND');
    assert.ok(!existsSync(join(server.dataDir, 'node', 'volumes', 'dataset')), 'its files are gone from the node');
  });

  test('bad mounts are refused before a sandbox is made: unknown volume, bad path, duplicates, VMs', async () => {
    await Volume.create('scratch', conn);
    await assert.rejects(
      Sandbox.create({ ...conn, ...spec, volumes: [{ name: 'nope', path: '/data' }] }),
      (e: unknown) => e instanceof NotFoundError && e.code === 'VOLUME_NOT_FOUND',
    );
    for (const path of ['/', '/proc/x', '/dev', '/a/../b', '/a/', 'relative']) {
      await assert.rejects(
        Sandbox.create({ ...conn, ...spec, volumes: [{ name: 'scratch', path }] }),
        (e: unknown) => e instanceof InvalidRequestError,
        path,
      );
    }
    await assert.rejects(
      Sandbox.create({
        ...conn,
        ...spec,
        volumes: [
          { name: 'scratch', path: '/a' },
          { name: 'scratch', path: '/b' },
        ],
      }),
      (e: unknown) => e instanceof InvalidRequestError && /listed twice/.test(e.message),
    );
    await assert.rejects(
      Sandbox.create({ ...conn, ...spec, backend: 'microvm', volumes: [{ name: 'scratch', path: '/a' }] }),
      (e: unknown) => e instanceof InvalidRequestError && e.code === 'BACKEND_UNSUPPORTED',
    );
    assert.equal((await Sandbox.list({ ...conn })).length, 0, 'no sandbox was made, not even a failed one');
    await (await Volume.get('scratch', conn)).delete();
  });

  test("a fork mounts its parent's volumes: one directory, shared by both", async () => {
    await Volume.create('shared', conn);
    const parent = await Sandbox.create({ ...conn, ...spec, volumes: [{ name: 'shared', path: '/shared' }] });
    await parent.commands.run('echo from-parent > /shared/f');
    const { sandboxes } = await parent.fork(1);
    const child = sandboxes[0]!;
    assert.equal((await child.commands.run('cat /shared/f')).stdout, 'from-parent\n');
    await child.commands.run('echo from-child >> /shared/f');
    assert.equal((await parent.commands.run('cat /shared/f')).stdout, 'from-parent\nfrom-child\n', 'one directory, shared');
    assert.deepEqual((await Volume.get('shared', conn)).info.mountedBy.sort(), [parent.id, child.id].sort());
    await child.kill();
    await parent.kill();
    await (await Volume.get('shared', conn)).delete();
  });

  test('the CLI: dsec volume create, run -v NAME:PATH[:ro], ls, rm', async () => {
    const env = { PATH: process.env['PATH'] ?? '/usr/bin:/bin', DSEC_URL: server.url, DSEC_API_KEY: server.apiKey };
    const cli = (...args: string[]): Promise<{ stdout: string; stderr: string }> =>
      promisify(execFile)(process.execPath, [CLI, ...args], { env });
    assert.equal((await cli('volume', 'create', 'cli-vol')).stdout, 'cli-vol\n');
    await cli('run', '--rm', '-v', 'cli-vol:/v', 'busybox', '--', 'sh', '-c', 'echo kept > /v/x');
    const r = await cli('run', '--rm', '-v', 'cli-vol:/v:ro', 'busybox', '--', 'cat', '/v/x');
    assert.equal(r.stdout, 'kept\n');
    const ls = JSON.parse((await cli('volume', 'ls', '--json')).stdout) as { name: string; mountedBy: string[] }[];
    assert.deepEqual(ls.find((v) => v.name === 'cli-vol')?.mountedBy, []);
    await assert.rejects(
      cli('run', '-v', 'cli-vol', 'busybox'),
      (e: { stderr?: string }) => /--volume takes NAME:PATH/.test(e.stderr ?? '') && !/\n\s+at /.test(e.stderr ?? ''),
    );
    assert.equal((await cli('volume', 'rm', 'cli-vol')).stdout, 'cli-vol\n');
  });

  test("another project's key neither sees, mounts nor deletes a project's volume", async () => {
    const admin = { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' };
    assert.equal(
      (await fetch(`${server.url}/v1/projects`, { method: 'POST', headers: admin, body: JSON.stringify({ name: 'other' }) })).status,
      201,
    );
    const key = (
      (await (
        await fetch(`${server.url}/v1/keys`, { method: 'POST', headers: admin, body: JSON.stringify({ project: 'other' }) })
      ).json()) as { key: string }
    ).key;
    const other = { url: server.url, apiKey: key };
    const v = await Volume.create('private-data', conn);
    assert.equal(v.info.project, 'default');
    assert.ok(!(await Volume.list(other)).some((x) => x.name === 'private-data'));
    await assert.rejects(Volume.get('private-data', other), (e: unknown) => e instanceof NotFoundError && e.code === 'VOLUME_NOT_FOUND');
    await assert.rejects(
      Sandbox.create({ ...other, ...spec, volumes: [{ name: 'private-data', path: '/d' }] }),
      (e: unknown) => e instanceof NotFoundError && e.code === 'VOLUME_NOT_FOUND',
    );
    const del = await fetch(`${server.url}/v1/volumes/private-data`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
    assert.equal(del.status, 404);
    await v.delete();
  });
});
