/**
 * Paths from the files API never reach the host: `..` chains, absolute host paths and symlinks
 * planted by the sandbox all resolve inside the sandbox root, and special files are never opened.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { InvalidRequestError, NotFoundError, Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectSdkError, expectWireError } from './helpers/wire.js';
import { ApiError } from '../src/api-error.js';
import { SYSTEM } from '../src/control/service/callers.js';

/** A read that must not return the host's data: 404 (resolved inside, absent) or 400 (refused). */
async function readMustNotReachHost(server: TestServer, id: string, path: string, hostSecret: string): Promise<number> {
  const res = await call(server, 'GET', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, { timeoutMs: 15_000 });
  assert.ok(!res.text.includes(hostSecret), `reading ${path} returned the host's secret`);
  assert.ok(res.status === 404 || res.status === 400, `reading ${path}: expected 404 or 400, got ${res.status} ${res.text.slice(0, 200)}`);
  return res.status;
}

describe('files API path escapes', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  const secret = `host-secret-${randomBytes(8).toString('hex')}`;
  const hostFile = `/var/tmp/dsec-test-host-secret-${randomBytes(6).toString('hex')}`;

  /** The host file is untouched: same content, same single line. */
  const assertHostFileUnchanged = (): void => {
    assert.equal(readFileSync(hostFile, 'utf8'), secret, 'the host file was changed through the files API');
  };

  before(async () => {
    writeFileSync(hostFile, secret, { mode: 0o600 });
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn });
  });
  after(async () => {
    rmSync(hostFile, { force: true });
    await server?.close();
  });

  test('a ../../../../ chain to the host file is resolved inside the sandbox (404)', async () => {
    assert.equal(await readMustNotReachHost(server, sb.id, `../../../../../../..${hostFile}`, secret), 404);
    assert.equal(await readMustNotReachHost(server, sb.id, `/tmp/../../../../..${hostFile}`, secret), 404);
  });

  test('the absolute host path of the host file is resolved inside the sandbox (404)', async () => {
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(hostFile)}`), 404, 'FILE_NOT_FOUND');
  });

  test('a host file that exists at the same path inside the sandbox: the sandbox file is read, not the host one', async () => {
    const inside = `${hostFile}-twin`;
    writeFileSync(inside, secret);
    try {
      await sb.files.write(inside, 'sandbox copy');
      assert.equal(await sb.files.readText(inside), 'sandbox copy');
      assert.equal(readFileSync(inside, 'utf8'), secret);
    } finally {
      rmSync(inside, { force: true });
    }
  });

  test('the host path of the sandbox own data dir is not reachable (404)', async () => {
    await readMustNotReachHost(server, sb.id, `${server.dataDir}/state.db`, 'SQLite format');
    await readMustNotReachHost(server, sb.id, `${server.dataDir}/client.json`, server.apiKey);
  });

  test('a symlink in the sandbox to the absolute host path is resolved inside the sandbox (404)', async () => {
    const r = await sb.commands.run(['ln', '-s', hostFile, '/tmp/abs-link']);
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(await readMustNotReachHost(server, sb.id, '/tmp/abs-link', secret), 404);
  });

  test('a symlink in the sandbox with a ../../.. chain is resolved inside the sandbox (404)', async () => {
    const r = await sb.commands.run(['ln', '-s', `../../../../../../../../..${hostFile}`, '/tmp/rel-link']);
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(await readMustNotReachHost(server, sb.id, '/tmp/rel-link', secret), 404);
  });

  test('a symlinked directory pointing at / followed by the host path stays inside (404)', async () => {
    const r = await sb.commands.run('mkdir -p /tmp/d && ln -s ../../../../../.. /tmp/d/up');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(await readMustNotReachHost(server, sb.id, `/tmp/d/up${hostFile}`, secret), 404);
  });

  test('a symlink to a file inside the sandbox is followed (resolved inside)', async () => {
    const r = await sb.commands.run('echo inside > /tmp/target && ln -s /tmp/target /tmp/good-link');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(await sb.files.readText('/tmp/good-link'), 'inside\n');
  });

  test('a symlink into /proc/1/root does not reach the host /proc (404 or 400)', async () => {
    const r = await sb.commands.run(
      `ln -s /proc/1/root${hostFile} /tmp/proc-link && ln -s /proc/self/root/etc/hostname /tmp/proc-self-link`,
    );
    assert.equal(r.exitCode, 0, r.stderr);
    await readMustNotReachHost(server, sb.id, '/tmp/proc-link', secret);
    const hostname = readFileSync('/etc/hostname', 'utf8').trim();
    const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=/tmp/proc-self-link`);
    assert.notEqual(res.status, 200, `read through /proc/self/root returned ${JSON.stringify(res.text)} (host hostname ${hostname})`);
  });

  test('writing with a ../ chain to the host path lands inside the sandbox, the host file is unchanged', async () => {
    await sb.files.write(`../../../../../..${hostFile}`, 'overwritten via dotdot');
    assertHostFileUnchanged();
    const r = await sb.commands.run(['cat', hostFile]);
    assert.equal(r.stdout, 'overwritten via dotdot');
  });

  test('writing to the absolute host path lands inside the sandbox, the host file is unchanged', async () => {
    await sb.files.write(hostFile, 'overwritten via absolute path');
    assertHostFileUnchanged();
    const r = await sb.commands.run(['cat', hostFile]);
    assert.equal(r.stdout, 'overwritten via absolute path');
  });

  test('writing through a symlink to an existing file updates the sandbox file, never the host', async () => {
    const target = `${hostFile}-existing`;
    const r = await sb.commands.run(`echo old > ${target} && ln -s ${target} /tmp/link-to-existing`);
    assert.equal(r.exitCode, 0, r.stderr);
    await sb.files.write('/tmp/link-to-existing', 'through link');
    assert.equal(existsSync(target), false, 'a host file appeared at the symlink target');
    assertHostFileUnchanged();
    assert.equal((await sb.commands.run(['cat', target])).stdout, 'through link');
  });

  test('writing through a symlink that points at the host path (dangling inside) creates the file inside the sandbox', async () => {
    const target = `${hostFile}-via-symlink`;
    const r = await sb.commands.run(['ln', '-s', target, '/tmp/link-out']);
    assert.equal(r.exitCode, 0, r.stderr);
    let error: unknown;
    try {
      await sb.files.write('/tmp/link-out', 'through dangling link');
    } catch (err) {
      error = err;
    } finally {
      // Whatever the outcome, the host must be untouched.
      assert.equal(existsSync(target), false, 'the write created a file on the HOST');
      assertHostFileUnchanged();
    }
    assert.equal(error, undefined, `write through a dangling symlink failed: ${(error as Error | undefined)?.message}`);
    const inside = await sb.commands.run(['cat', target]);
    assert.equal(inside.stdout, 'through dangling link', 'the content did not land inside the sandbox');
  });

  test('writing under a symlinked directory that points at a host directory stays inside the sandbox', async () => {
    const name = `dsec-test-host-dir-write-${randomBytes(4).toString('hex')}`;
    const r = await sb.commands.run('ln -s /var/tmp /tmp/hostvar');
    assert.equal(r.exitCode, 0, r.stderr);
    await sb.files.write(`/tmp/hostvar/${name}`, 'in sandbox var/tmp');
    assert.equal(existsSync(`/var/tmp/${name}`), false, 'the write created a file on the HOST');
    assert.equal((await sb.commands.run(['cat', `/var/tmp/${name}`])).stdout, 'in sandbox var/tmp');
  });

  test('a symlink loop is refused: 400 INVALID_REQUEST, no hang', async () => {
    const r = await sb.commands.run('ln -s /tmp/loop-a /tmp/loop-b && ln -s /tmp/loop-b /tmp/loop-a');
    assert.equal(r.exitCode, 0, r.stderr);
    await expectSdkError(sb.files.read('/tmp/loop-a', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
    await expectSdkError(sb.files.write('/tmp/loop-a', 'x', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
  });

  test('reading a FIFO made in the sandbox does not hang: 400 INVALID_REQUEST', async () => {
    const r = await sb.commands.run(['mkfifo', '/tmp/fifo']);
    assert.equal(r.exitCode, 0, r.stderr);
    // The call timeout only keeps a hang from stalling the suite; a hang is a failure.
    await expectSdkError(sb.files.read('/tmp/fifo', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
  });

  test('writing to a FIFO made in the sandbox does not hang: 400 INVALID_REQUEST', async () => {
    const r = await sb.commands.run(['mkfifo', '/tmp/fifo-w']);
    assert.equal(r.exitCode, 0, r.stderr);
    await expectSdkError(sb.files.write('/tmp/fifo-w', 'x', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
  });

  test('a device node made in the sandbox is never opened: 400 INVALID_REQUEST', async () => {
    const r = await sb.commands.run('mknod /tmp/zero c 1 5');
    if (server.dsec.edge.userns) {
      // In a user namespace (DSEC_USERNS) the sandbox cannot make device nodes at all.
      assert.notEqual(r.exitCode, 0, 'a user-namespaced sandbox made a device node');
      return;
    }
    assert.equal(r.exitCode, 0, r.stderr);
    await expectSdkError(sb.files.read('/tmp/zero', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
  });

  test('a symlink to a FIFO is refused too (the final target is checked)', async () => {
    const r = await sb.commands.run('mkfifo /tmp/fifo2 && ln -s /tmp/fifo2 /tmp/fifo-link');
    assert.equal(r.exitCode, 0, r.stderr);
    await expectSdkError(sb.files.read('/tmp/fifo-link', { timeoutMs: 15_000 }), InvalidRequestError, 'INVALID_REQUEST');
  });

  test('reading /proc/1/environ through the files API: 400 INVALID_REQUEST', async () => {
    const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=/proc/1/environ`);
    expectWireError(res, 400, 'INVALID_REQUEST');
  });

  test('reading /sys and /dev paths through the files API: 400 INVALID_REQUEST', async () => {
    for (const p of ['/sys/kernel/hostname', '/dev/zero', '//proc//self/environ', 'proc/self/status']) {
      expectWireError(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(p)}`), 400, 'INVALID_REQUEST');
    }
  });

  test('reading /proc via a dot-dot path is refused like /proc itself (400)', async () => {
    expectWireError(
      await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent('/tmp/../proc/1/environ')}`),
      400,
      'INVALID_REQUEST',
    );
  });

  test('writing under /dev via a dot-dot path is refused like /dev itself (400), not reported written and invisible', async () => {
    const res = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent('/tmp/../dev/planted')}`, { body: 'x' });
    const seen = await sb.commands.run('test -e /dev/planted && echo visible || echo invisible');
    assert.ok(
      res.status === 400 || seen.stdout === 'visible\n',
      `PUT /tmp/../dev/planted answered ${res.status} ${res.text} but the sandbox cannot see the file (${seen.stdout.trim()})`,
    );
  });

  test('a path with a NUL byte: 400 INVALID_REQUEST', async () => {
    expectWireError(
      await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent('/etc/passwd\0.png')}`),
      400,
      'INVALID_REQUEST',
    );
  });

  test('acting as a user of the sandbox, reads, writes and symlinks still resolve inside it, and /proc stays refused', async () => {
    const files = server.dsec.control.files;
    const as = { as: { uid: 1000, gid: 1000, groups: [] } };
    const r = await sb.commands.run(
      `mkdir -p /tmp/u && chown 1000:1000 /tmp/u && ln -s ${hostFile} /tmp/u/to-host && ln -s ../../../../.. /tmp/u/up`,
    );
    assert.equal(r.exitCode, 0, r.stderr);
    // Each resolves to the sandbox's own file at that path (an earlier test wrote one there), never the host's.
    for (const p of [`../../../../../..${hostFile}`, hostFile, '/tmp/u/to-host', `/tmp/u/up${hostFile}`]) {
      const got = await files.readFile(SYSTEM, sb.id, p, 1 << 20, as).catch((e: unknown) => {
        if (e instanceof ApiError && e.code === 'FILE_NOT_FOUND') return Buffer.alloc(0);
        throw e;
      });
      assert.ok(!got.toString().includes(secret), `reading ${p} as a user returned the host's secret`);
    }
    // The link's target inside (an earlier test made it, root's 0644): the kernel refuses the user; the host's is untouched either way.
    await assert.rejects(
      files.writeFile(SYSTEM, sb.id, '/tmp/u/to-host', Buffer.from('as a user'), 0o644, as),
      (e: unknown) => e instanceof ApiError && e.code === 'FILE_PERMISSION_DENIED',
    );
    assertHostFileUnchanged();
    await assert.rejects(
      files.readFile(SYSTEM, sb.id, '/proc/1/environ', 1 << 20, as),
      (e: unknown) => e instanceof ApiError && e.code === 'INVALID_REQUEST',
    );
  });

  test('none of the attempts above changed the host file', () => {
    assertHostFileUnchanged();
  });

  test('the sandbox itself cannot see the host file', async () => {
    const r = await sb.commands.run(`cat ${hostFile} 2>/dev/null; ls /var/tmp`);
    assert.ok(!r.stdout.includes(secret));
    // NotFoundError class for completeness: the SDK maps the 404 to it.
    await expectSdkError(sb.files.read(`${hostFile}-never-created`), NotFoundError, 'FILE_NOT_FOUND');
  });
});
