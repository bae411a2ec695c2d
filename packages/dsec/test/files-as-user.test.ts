/**
 * File calls acting as a user of the sandbox (FileService's `as`): the kernel decides each access
 * as for that user (FILE_PERMISSION_DENIED when it refuses), what the user makes is the user's, the
 * edge's thread is root again after every call; and user xattrs as file metadata. Through the
 * control plane's FileService into the in-process edge, and through HttpEdgeClient → the edge's
 * HTTP server, on sandboxes with and without a user namespace.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import { Sandbox } from '@dsec/sdk';
import { ApiError } from '../src/api-error.js';
import { HttpEdgeClient } from '../src/control/edges/http-edge-client.js';
import { SYSTEM } from '../src/control/service/callers.js';
import type { FileService } from '../src/control/service/files.js';
import type { App } from '../src/http/app.js';
import type { FileActor } from '../src/edge/protocol/edge-api.js';
import { buildEdgeServer } from '../src/edge/server/edge-server.js';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const ALICE: FileActor = { uid: 1000, gid: 1000, groups: [] };
const ALICE_IN_TEAM: FileActor = { uid: 1000, gid: 1000, groups: [2000] };
const PREFIX = 'user.e2b.';

async function expectCode(p: Promise<unknown>, code: string, message?: RegExp): Promise<ApiError> {
  let caught: ApiError | undefined;
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof ApiError, `expected an ApiError, got ${String(err)}`);
    assert.equal(err.code, code, err.message);
    if (message) assert.match(err.message, message);
    caught = err;
    return true;
  });
  return caught!;
}

/** The test process's main thread is the in-process edge's: its filesystem ids and groups must be root's. */
function assertThreadIsRoot(): void {
  const status = readFileSync('/proc/thread-self/status', 'utf8');
  const field = (key: string): string => (new RegExp(`^${key}:\\s*(.*)$`, 'm').exec(status)?.[1] ?? '').trim();
  assert.deepEqual(field('Uid').split(/\s+/), ['0', '0', '0', '0'], 'Uid (real, effective, saved, fs)');
  assert.deepEqual(field('Gid').split(/\s+/), ['0', '0', '0', '0'], 'Gid (real, effective, saved, fs)');
  assert.ok(!/\b(1000|2000)\b/.test(field('Groups')), `Groups: ${field('Groups')}`);
}

for (const userns of [true, false])
  describe(
    `files as a user of the sandbox (${userns ? 'user namespace' : 'no user namespace'})`,
    {
      skip: integrationSkipReason(),
      timeout: 180_000,
    },
    () => {
      let server: TestServer;
      let sb: Sandbox;
      let files: FileService;
      let edgeApp: App;
      let client: HttpEdgeClient;
      const sh = async (cmd: string): Promise<string> => {
        const r = await sb.commands.run(cmd);
        assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
        return r.stdout.trim();
      };

      before(async () => {
        server = await startTestServer({ userns });
        sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 128 } });
        files = server.dsec.control.files;
        // busybox has no useradd: the users are lines of /etc/passwd and /etc/group, written as root.
        const passwd = (await files.readFile(SYSTEM, sb.id, '/etc/passwd', 1 << 20)).toString();
        await files.writeFile(SYSTEM, sb.id, '/etc/passwd', Buffer.from(`${passwd}alice:x:1000:1000::/home/alice:/bin/sh\n`), 0o644);
        const group = (await files.readFile(SYSTEM, sb.id, '/etc/group', 1 << 20)).toString();
        await files.writeFile(SYSTEM, sb.id, '/etc/group', Buffer.from(`${group}alice:x:1000:\nteam:x:2000:alice\n`), 0o644);
        await sh('mkdir -p /home/alice /srv/team && chown 1000:1000 /home/alice && chown 0:2000 /srv/team && chmod 0775 /srv/team');
        const token = 'dsecjoin_files-as-user-test';
        edgeApp = await buildEdgeServer(server.dsec.node, { token, log: pino({ level: 'silent' }) });
        await edgeApp.listen({ host: '127.0.0.1', port: 0 });
        client = new HttpEdgeClient(server.edgeId, `http://127.0.0.1:${(edgeApp.server.address() as { port: number }).port}`, token);
      });
      after(async () => {
        try {
          await edgeApp?.close();
        } finally {
          await server?.close();
        }
      });

      test('writing /etc/x as the user: 403 FILE_PERMISSION_DENIED naming uid and path, and /etc/x is not there', async () => {
        const err = await expectCode(
          files.writeFile(SYSTEM, sb.id, '/etc/x', Buffer.from('no'), 0o644, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
          /^permission denied: uid 1000 may not write \/etc\/x$/,
        );
        assert.equal(err.status, 403);
        await expectCode(files.stat(SYSTEM, sb.id, '/etc/x'), 'FILE_NOT_FOUND');
        assertThreadIsRoot();
      });

      test("removing root's /etc/hostname as the user fails and it is still there", async () => {
        await files.writeFile(SYSTEM, sb.id, '/etc/hostname', Buffer.from('box\n'), 0o644);
        await expectCode(
          files.removePath(SYSTEM, sb.id, '/etc/hostname', false, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
          /uid 1000 may not remove/,
        );
        assert.equal((await files.stat(SYSTEM, sb.id, '/etc/hostname')).type, 'file');
        await expectCode(files.renamePath(SYSTEM, sb.id, '/etc/hostname', '/home/alice/h', { as: ALICE }), 'FILE_PERMISSION_DENIED');
        assertThreadIsRoot();
      });

      test('in a directory it owns the user writes and makes directories, owned uid:gid as the sandbox sees them', async () => {
        assert.equal(await files.writeFile(SYSTEM, sb.id, '/home/alice/notes/a.txt', Buffer.from('mine'), 0o640, { as: ALICE }), 4);
        await files.makeDir(SYSTEM, sb.id, '/home/alice/d/e', true, { as: ALICE });
        assert.equal(await sh('stat -c %u:%g /home/alice/notes /home/alice/notes/a.txt /home/alice/d/e | sort -u'), '1000:1000');
        assert.equal(await sh('stat -c %a /home/alice/notes/a.txt'), '640');
        const st = await files.stat(SYSTEM, sb.id, '/home/alice/notes/a.txt', { as: ALICE });
        assert.deepEqual([st.uid, st.gid], [1000, 1000]);
        assert.equal((await files.readFile(SYSTEM, sb.id, '/home/alice/notes/a.txt', 100, { as: ALICE })).toString(), 'mine');
        await files.renamePath(SYSTEM, sb.id, '/home/alice/notes/a.txt', '/home/alice/b.txt', { as: ALICE });
        assert.deepEqual(
          (await files.listDir(SYSTEM, sb.id, '/home/alice', { as: ALICE })).entries.map((e) => e.name),
          ['b.txt', 'd', 'notes'],
        );
        assertThreadIsRoot();
      });

      test("a user in a supplementary group writes that group's writable directory; without the group it may not", async () => {
        await files.writeFile(SYSTEM, sb.id, '/srv/team/plan', Buffer.from('go'), 0o644, { as: ALICE_IN_TEAM });
        assert.equal(await sh('stat -c %u /srv/team/plan'), '1000');
        await expectCode(
          files.writeFile(SYSTEM, sb.id, '/srv/team/other', Buffer.from('no'), 0o644, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
        );
        await expectCode(files.stat(SYSTEM, sb.id, '/srv/team/other'), 'FILE_NOT_FOUND');
        assertThreadIsRoot();
      });

      test('a mode-0600 root file cannot be read (nor a 0700 root directory listed) by the user; root still can', async () => {
        await files.writeFile(SYSTEM, sb.id, '/srv/secret', Buffer.from('s3cret'), 0o600);
        await files.makeDir(SYSTEM, sb.id, '/srv/closed', false);
        await sh('chmod 0700 /srv/closed');
        await expectCode(
          files.readFile(SYSTEM, sb.id, '/srv/secret', 100, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
          /uid 1000 may not read \/srv\/secret/,
        );
        await expectCode(files.listDir(SYSTEM, sb.id, '/srv/closed', { as: ALICE }), 'FILE_PERMISSION_DENIED', /may not list/);
        assert.equal((await files.readFile(SYSTEM, sb.id, '/srv/secret', 100)).toString(), 's3cret');
        assertThreadIsRoot();
      });

      test("a recursive remove as the user stops at a root-owned file in a root-owned 0755 directory, with the user's own entries gone", async () => {
        await files.writeFile(SYSTEM, sb.id, '/home/alice/tree/mine.txt', Buffer.from('x'), 0o644, { as: ALICE });
        await files.writeFile(SYSTEM, sb.id, '/home/alice/tree/locked/roots.txt', Buffer.from('r'), 0o644);
        await sh('chown 0:0 /home/alice/tree/locked && chmod 0755 /home/alice/tree/locked');
        await expectCode(
          files.removePath(SYSTEM, sb.id, '/home/alice/tree', true, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
          /^permission denied: uid 1000 may not remove \/home\/alice\/tree\/locked\/roots\.txt$/,
        );
        assert.equal((await files.stat(SYSTEM, sb.id, '/home/alice/tree/locked/roots.txt')).type, 'file');
        // Root's recursive remove (the sandbox's rm) takes what is left.
        await files.removePath(SYSTEM, sb.id, '/home/alice/tree', true);
        await expectCode(files.stat(SYSTEM, sb.id, '/home/alice/tree'), 'FILE_NOT_FOUND');
        // A tree wholly the user's goes.
        await files.writeFile(SYSTEM, sb.id, '/home/alice/t2/a/b/c.txt', Buffer.from('x'), 0o644, { as: ALICE });
        await files.removePath(SYSTEM, sb.id, '/home/alice/t2', true, { as: ALICE });
        await expectCode(files.stat(SYSTEM, sb.id, '/home/alice/t2'), 'FILE_NOT_FOUND');
        assertThreadIsRoot();
      });

      test("after the user's calls, root's calls keep root's rights: it writes /etc and reads 0600 files", async () => {
        await expectCode(files.writeFile(SYSTEM, sb.id, '/etc/y', Buffer.from('no'), 0o644, { as: ALICE }), 'FILE_PERMISSION_DENIED');
        await files.writeFile(SYSTEM, sb.id, '/etc/root-wrote', Buffer.from('ok'), 0o600);
        assert.equal((await files.readFile(SYSTEM, sb.id, '/etc/root-wrote', 10)).toString(), 'ok');
        assert.equal(await sh('stat -c %u:%g /etc/root-wrote'), '0:0');
        // uid 0 is the sandbox's root, as without `as`.
        await files.writeFile(SYSTEM, sb.id, '/etc/root-as', Buffer.from('ok'), 0o644, { as: { uid: 0, gid: 0, groups: [] } });
        assert.equal(await sh('stat -c %u:%g /etc/root-as'), '0:0');
        assertThreadIsRoot();
      });

      test('ids outside the sandbox are refused (INVALID_REQUEST)', async () => {
        if (userns) {
          await expectCode(
            files.readFile(SYSTEM, sb.id, '/etc/passwd', 10, { as: { uid: 70000, gid: 1000, groups: [] } }),
            'INVALID_REQUEST',
            /outside the sandbox's user namespace/,
          );
        }
        await expectCode(files.readFile(SYSTEM, sb.id, '/etc/passwd', 10, { as: { uid: -1, gid: 1000, groups: [] } }), 'INVALID_REQUEST');
      });

      test('metadata: written with the file, shown by stat and list under the prefix, cleared by an overwrite without, kept by a rename', async () => {
        const p = '/home/alice/meta.txt';
        await files.writeFile(SYSTEM, sb.id, p, Buffer.from('m'), 0o644, {
          as: ALICE,
          metadata: { prefix: PREFIX, values: { owner: 'alice', note: 'héllo ✓' } },
        });
        const st = await files.stat(SYSTEM, sb.id, p, { as: ALICE, metadataPrefix: PREFIX });
        assert.deepEqual(st.metadata, { owner: 'alice', note: 'héllo ✓' });
        assert.equal((await files.stat(SYSTEM, sb.id, p)).metadata, undefined, 'not asked for: not shown');
        const listed = (await files.listDir(SYSTEM, sb.id, '/home/alice', { metadataPrefix: PREFIX })).entries;
        assert.deepEqual(listed.find((e) => e.name === 'meta.txt')?.metadata, { owner: 'alice', note: 'héllo ✓' });
        assert.equal(listed.find((e) => e.name === 'b.txt')?.metadata, undefined, 'a file without any has no field');
        // A value replaced, one removed; an attribute outside the prefix is left alone.
        await files.writeFile(SYSTEM, sb.id, p, Buffer.from('m'), 0o644, {
          as: ALICE,
          metadata: { prefix: 'user.keep.', values: { x: '1' } },
        });
        assert.deepEqual((await files.stat(SYSTEM, sb.id, p, { metadataPrefix: PREFIX })).metadata, { owner: 'alice', note: 'héllo ✓' });
        await files.writeFile(SYSTEM, sb.id, p, Buffer.from('m2'), 0o644, {
          as: ALICE,
          metadata: { prefix: PREFIX, values: { owner: 'bob' } },
        });
        assert.deepEqual((await files.stat(SYSTEM, sb.id, p, { metadataPrefix: PREFIX })).metadata, { owner: 'bob' });
        assert.deepEqual((await files.stat(SYSTEM, sb.id, p, { metadataPrefix: 'user.keep.' })).metadata, { x: '1' });
        assert.deepEqual((await files.stat(SYSTEM, sb.id, p, { metadataPrefix: 'user.' })).metadata, { 'e2b.owner': 'bob', 'keep.x': '1' });
        await files.renamePath(SYSTEM, sb.id, p, '/home/alice/meta2.txt', { as: ALICE });
        assert.deepEqual((await files.stat(SYSTEM, sb.id, '/home/alice/meta2.txt', { metadataPrefix: PREFIX })).metadata, { owner: 'bob' });
        await files.writeFile(SYSTEM, sb.id, '/home/alice/meta2.txt', Buffer.from('m3'), 0o644, {
          metadata: { prefix: PREFIX, values: {} },
        });
        assert.equal((await files.stat(SYSTEM, sb.id, '/home/alice/meta2.txt', { metadataPrefix: PREFIX })).metadata, undefined);
        assertThreadIsRoot();
      });

      test('metadata: a user cannot set it on a file it cannot write; a prefix outside user. is refused', async () => {
        await files.writeFile(SYSTEM, sb.id, '/srv/roots-file', Buffer.from('r'), 0o644);
        await expectCode(
          files.writeFile(SYSTEM, sb.id, '/srv/roots-file', Buffer.from('r'), 0o644, {
            as: ALICE,
            metadata: { prefix: PREFIX, values: { a: 'b' } },
          }),
          'FILE_PERMISSION_DENIED',
        );
        assert.equal((await files.stat(SYSTEM, sb.id, '/srv/roots-file', { metadataPrefix: PREFIX })).metadata, undefined);
        await expectCode(
          files.writeFile(SYSTEM, sb.id, '/tmp/t', Buffer.from('r'), 0o644, { metadata: { prefix: 'trusted.x.', values: { a: 'b' } } }),
          'INVALID_REQUEST',
          /user\./,
        );
        await expectCode(files.stat(SYSTEM, sb.id, '/tmp', { metadataPrefix: 'security.' }), 'INVALID_REQUEST');
        assertThreadIsRoot();
      });

      test('over the edge protocol (HttpEdgeClient → edge server): as, metadata and the permission error cross unchanged', async () => {
        await client.writeFile(sb.id, '/home/alice/http.txt', Buffer.from('h'), 0o600, {
          as: ALICE_IN_TEAM,
          metadata: { prefix: PREFIX, values: { k: 'v' } },
        });
        const st = await client.statPath(sb.id, '/home/alice/http.txt', { as: ALICE, metadataPrefix: PREFIX });
        assert.deepEqual([st.uid, st.gid, st.mode, st.metadata], [1000, 1000, '0600', { k: 'v' }]);
        const listed = await client.listDir(sb.id, '/home/alice', { as: ALICE, metadataPrefix: PREFIX });
        assert.deepEqual(listed.entries.find((e) => e.name === 'http.txt')?.metadata, { k: 'v' });
        assert.equal((await client.readFile(sb.id, '/home/alice/http.txt', 10, { as: ALICE })).toString(), 'h');
        const err = await expectCode(
          client.writeFile(sb.id, '/etc/z', Buffer.from('no'), 0o644, { as: ALICE }),
          'FILE_PERMISSION_DENIED',
          /uid 1000 may not write \/etc\/z/,
        );
        assert.equal(err.status, 403);
        await client.makeDir(sb.id, '/srv/team/sub', false, { as: ALICE_IN_TEAM });
        await client.renamePath(sb.id, '/srv/team/sub', '/srv/team/sub2', { as: ALICE_IN_TEAM });
        await expectCode(client.removePath(sb.id, '/srv/team/sub2', true, { as: ALICE }), 'FILE_PERMISSION_DENIED');
        await client.removePath(sb.id, '/srv/team/sub2', true, { as: ALICE_IN_TEAM });
        await expectCode(client.statPath(sb.id, '/srv/team/sub2'), 'FILE_NOT_FOUND');
        assertThreadIsRoot();
      });
    },
  );
