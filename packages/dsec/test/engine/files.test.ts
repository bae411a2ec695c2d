/**
 * The files API: stat, list, mkdir, remove (recursive too), rename; directories as tar streams
 * (download/upload round trip keeps content and modes); and hostile tar uploads — symlinks to
 * host paths followed by files "through" them, `..` and absolute names — never touching the host.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { ConflictError, NotFoundError, Sandbox } from '@dsec/sdk';
import { startTestServer, type TestServer } from '../helpers/server.js';
import { engineBackends } from '../helpers/vm.js';
import { encodeTar, parseTar } from './support/tar.js';

const md5 = (b: Buffer | Uint8Array): string => createHash('md5').update(b).digest('hex');

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: files API and tar (${backend})`, { skip, timeout: 180_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;
    /** A directory on the host that hostile archives aim at; it must stay empty. */
    let hostMarker: string;

    before(async () => {
      server = await startTestServer();
      sb = await Sandbox.create({ ...server.conn, backend, resources: { memoryMiB } });
      hostMarker = `/var/tmp/dsec-engine-marker-${randomBytes(6).toString('hex')}`;
      mkdirSync(hostMarker);
    });
    after(async () => {
      if (hostMarker && existsSync(hostMarker)) rmSync(hostMarker, { recursive: true, force: true });
      await server?.close();
    });

    test('stat reports type, size, mode, owner and mtime of a file, a directory and a symlink (not followed)', async () => {
      await sb.files.write('/tmp/st/file.txt', 'hello', { mode: 0o640 });
      const r = await sb.commands.run('ln -s /etc/passwd /tmp/st/link');
      assert.equal(r.exitCode, 0, r.stderr);
      const f = await sb.files.stat('/tmp/st/file.txt');
      assert.deepEqual([f.type, f.size, f.mode, f.name, f.path, f.uid], ['file', 5, '0640', 'file.txt', '/tmp/st/file.txt', 0]);
      assert.ok(!Number.isNaN(Date.parse(f.mtime)));
      const d = await sb.files.stat('/tmp/st');
      assert.equal(d.type, 'dir');
      const l = await sb.files.stat('/tmp/st/link');
      assert.equal(l.type, 'symlink');
      assert.equal(l.linkTarget, '/etc/passwd');
    });

    test('stat of a missing path: 404 FILE_NOT_FOUND', async () => {
      await assert.rejects(sb.files.stat('/tmp/no/such/thing'), (e: unknown) => e instanceof NotFoundError && e.code === 'FILE_NOT_FOUND');
      assert.equal(await sb.files.exists('/tmp/no/such/thing'), false);
    });

    test('list returns the entries of a directory, sorted, with their types', async () => {
      await sb.files.mkdir('/tmp/ls/sub');
      await sb.files.write('/tmp/ls/b.txt', 'b');
      await sb.files.write('/tmp/ls/a.txt', 'aa');
      const listing = await sb.files.list('/tmp/ls');
      assert.equal(listing.truncated, false);
      assert.deepEqual(
        listing.entries.map((e) => [e.name, e.type, e.path]),
        [
          ['a.txt', 'file', '/tmp/ls/a.txt'],
          ['b.txt', 'file', '/tmp/ls/b.txt'],
          ['sub', 'dir', '/tmp/ls/sub'],
        ],
      );
      assert.equal(listing.entries[0]!.size, 2);
    });

    test('list of a file: 409 PATH_CONFLICT; of a missing dir: 404 FILE_NOT_FOUND', async () => {
      await sb.files.write('/tmp/ls-file', 'x');
      await assert.rejects(sb.files.list('/tmp/ls-file'), (e: unknown) => e instanceof ConflictError);
      await assert.rejects(sb.files.list('/tmp/ls-missing'), (e: unknown) => e instanceof NotFoundError && e.code === 'FILE_NOT_FOUND');
    });

    test('mkdir creates parents by default; parents:false needs the parent and refuses an existing dir', async () => {
      await sb.files.mkdir('/tmp/mk/a/b/c');
      assert.equal((await sb.files.stat('/tmp/mk/a/b/c')).type, 'dir');
      assert.equal((await sb.files.stat('/tmp/mk/a/b/c')).mode, '0755');
      await sb.files.mkdir('/tmp/mk/a/b/c'); // mkdir -p of an existing dir is fine
      await assert.rejects(sb.files.mkdir('/tmp/mk/x/y', { parents: false }), (e: unknown) => e instanceof NotFoundError);
      await sb.files.mkdir('/tmp/mk/only', { parents: false });
      await assert.rejects(sb.files.mkdir('/tmp/mk/only', { parents: false }), (e: unknown) => e instanceof ConflictError);
      assert.equal((await sb.commands.run('[ -d /tmp/mk/a/b/c ] && [ -d /tmp/mk/only ] && echo yes')).stdout, 'yes\n');
    });

    test('remove deletes a file, a symlink (not its target) and an empty directory', async () => {
      await sb.files.write('/tmp/rm/f', 'x');
      await sb.files.mkdir('/tmp/rm/empty');
      await sb.files.write('/tmp/rm/target', 'keep me');
      await sb.commands.run('ln -s /tmp/rm/target /tmp/rm/link');
      await sb.files.remove('/tmp/rm/f');
      await sb.files.remove('/tmp/rm/empty');
      await sb.files.remove('/tmp/rm/link');
      assert.deepEqual(
        (await sb.files.list('/tmp/rm')).entries.map((e) => e.name),
        ['target'],
      );
      assert.equal(await sb.files.readText('/tmp/rm/target'), 'keep me');
    });

    test('remove of a non-empty directory needs recursive: 409 PATH_CONFLICT without, gone with', async () => {
      await sb.files.write('/tmp/rmr/a/b/c.txt', 'deep');
      await sb.files.write('/tmp/rmr/top.txt', 'top');
      await assert.rejects(sb.files.remove('/tmp/rmr'), (e: unknown) => e instanceof ConflictError && e.code === 'PATH_CONFLICT');
      assert.equal(await sb.files.exists('/tmp/rmr/a/b/c.txt'), true, 'nothing removed by the refused call');
      await sb.files.remove('/tmp/rmr', { recursive: true });
      assert.equal(await sb.files.exists('/tmp/rmr'), false);
    });

    test('recursive remove of a tree holding a symlink to an outside directory removes the link, not the target', async () => {
      await sb.files.write('/tmp/keep-dir/precious', 'precious');
      await sb.files.mkdir('/tmp/rml');
      await sb.commands.run('ln -s /tmp/keep-dir /tmp/rml/link');
      await sb.files.remove('/tmp/rml', { recursive: true });
      assert.equal(await sb.files.exists('/tmp/rml'), false);
      assert.equal(await sb.files.readText('/tmp/keep-dir/precious'), 'precious');
    });

    test('remove of a missing path: 404 FILE_NOT_FOUND', async () => {
      await assert.rejects(sb.files.remove('/tmp/never-was'), (e: unknown) => e instanceof NotFoundError && e.code === 'FILE_NOT_FOUND');
      await assert.rejects(sb.files.remove('/tmp/never-was', { recursive: true }), (e: unknown) => e instanceof NotFoundError);
    });

    test('rename moves a file and a directory (with its contents) to a new name and place', async () => {
      await sb.files.write('/tmp/mv/a.txt', 'A');
      await sb.files.write('/tmp/mv/dir/inner.txt', 'I');
      await sb.files.mkdir('/tmp/mv/dest');
      await sb.files.rename('/tmp/mv/a.txt', '/tmp/mv/dest/b.txt');
      await sb.files.rename('/tmp/mv/dir', '/tmp/mv/dest/dir2');
      assert.equal(await sb.files.exists('/tmp/mv/a.txt'), false);
      assert.equal(await sb.files.readText('/tmp/mv/dest/b.txt'), 'A');
      assert.equal(await sb.files.readText('/tmp/mv/dest/dir2/inner.txt'), 'I');
      await assert.rejects(sb.files.rename('/tmp/mv/nothing', '/tmp/mv/x'), (e: unknown) => e instanceof NotFoundError);
    });

    test('tar download: one top-level entry with every file, directory and symlink, contents and modes as in the sandbox', async () => {
      const bin = randomBytes(70_000);
      await sb.files.write('/tmp/tsrc/run.sh', '#!/bin/sh\necho hi\n', { mode: 0o755 });
      await sb.files.write('/tmp/tsrc/secret', 'top secret', { mode: 0o600 });
      await sb.files.write('/tmp/tsrc/sub/data.bin', bin, { mode: 0o644 });
      await sb.commands.run('ln -s run.sh /tmp/tsrc/link && chmod 0750 /tmp/tsrc/sub');
      const entries = parseTar(Buffer.from(await sb.files.downloadTar('/tmp/tsrc')));
      const by = new Map(entries.map((e) => [e.name.replace(/\/$/, ''), e]));
      assert.deepEqual([...by.keys()].sort(), ['tsrc', 'tsrc/link', 'tsrc/run.sh', 'tsrc/secret', 'tsrc/sub', 'tsrc/sub/data.bin']);
      assert.equal(by.get('tsrc/run.sh')!.mode, 0o755);
      assert.equal(by.get('tsrc/secret')!.mode, 0o600);
      assert.equal(by.get('tsrc/sub')!.type, 'dir');
      assert.equal(by.get('tsrc/sub')!.mode, 0o750);
      assert.equal(by.get('tsrc/link')!.type, 'symlink');
      assert.equal(by.get('tsrc/link')!.linkname, 'run.sh');
      assert.equal(by.get('tsrc/secret')!.data.toString(), 'top secret');
      assert.ok(by.get('tsrc/sub/data.bin')!.data.equals(bin));
    });

    test('tar download of a single file gives one entry with its bytes', async () => {
      await sb.files.write('/tmp/single.txt', 'just me', { mode: 0o604 });
      const entries = parseTar(Buffer.from(await sb.files.downloadTar('/tmp/single.txt')));
      assert.equal(entries.length, 1);
      assert.deepEqual([entries[0]!.name, entries[0]!.data.toString(), entries[0]!.mode], ['single.txt', 'just me', 0o604]);
    });

    test('tar download of a missing path: 404 FILE_NOT_FOUND', async () => {
      await assert.rejects(
        sb.files.downloadTar('/tmp/nope-tar'),
        (e: unknown) => e instanceof NotFoundError && e.code === 'FILE_NOT_FOUND',
      );
    });

    test('tar round trip: download a tree and upload it elsewhere — same contents, modes and symlinks', async () => {
      await sb.files.write('/tmp/rt/x/exec.sh', 'echo x', { mode: 0o700 });
      await sb.files.write('/tmp/rt/x/ro.txt', 'read only', { mode: 0o444 });
      await sb.files.write('/tmp/rt/x/deep/er/file', randomBytes(10_000));
      await sb.commands.run('ln -s deep/er/file /tmp/rt/x/shortcut');
      const archive = await sb.files.downloadTar('/tmp/rt/x');
      const up = await sb.files.uploadTar('/tmp/rt-copy', archive);
      assert.equal(up.bytes, archive.length);
      const manifest = async (dir: string): Promise<string> =>
        (
          await sb.commands.run(
            `cd ${dir} && find . | sort | while read p; do if [ -L "$p" ]; then echo "$p L $(readlink "$p")"; elif [ -f "$p" ]; then echo "$p F $(stat -c %a "$p") $(md5sum < "$p" | cut -d' ' -f1)"; else echo "$p D $(stat -c %a "$p")"; fi; done`,
          )
        ).stdout;
      const a = await manifest('/tmp/rt');
      const b = await manifest('/tmp/rt-copy');
      assert.ok(a.includes('./x/exec.sh F 700') && a.includes('./x/ro.txt F 444') && a.includes('./x/shortcut L deep/er/file'), a);
      assert.equal(b, a);
    });

    test('tar upload of an archive built outside (ustar) lands with its contents and modes', async () => {
      const payload = randomBytes(3000);
      const tar = encodeTar([
        { name: 'pkg/', type: 'dir', mode: 0o755 },
        { name: 'pkg/bin/', type: 'dir', mode: 0o711 },
        { name: 'pkg/bin/tool', type: 'file', mode: 0o755, data: '#!/bin/sh\necho tool-ran\n' },
        { name: 'pkg/data.bin', type: 'file', mode: 0o600, data: payload },
        { name: 'pkg/latest', type: 'symlink', mode: 0o777, linkname: 'bin/tool' },
      ]);
      await sb.files.uploadTar('/opt/unpacked', tar);
      assert.equal((await sb.commands.run('/opt/unpacked/pkg/latest')).stdout, 'tool-ran\n');
      assert.equal((await sb.files.stat('/opt/unpacked/pkg/bin')).mode, '0711');
      assert.equal((await sb.files.stat('/opt/unpacked/pkg/data.bin')).mode, '0600');
      assert.equal(md5(await sb.files.read('/opt/unpacked/pkg/data.bin')), md5(payload));
    });

    test('a tar symlink to a host directory followed by a file through it never writes on the host (refused or kept inside)', async () => {
      // The same path exists inside the sandbox, so a tar that followed the symlink there could succeed.
      await sb.files.mkdir(hostMarker);
      const tar = encodeTar([
        { name: 'evil', type: 'symlink', mode: 0o777, linkname: hostMarker },
        { name: 'evil/pwned', type: 'file', mode: 0o644, data: 'pwned via symlink' },
      ]);
      const upload = await sb.files.uploadTar('/tmp/evil1', tar).then(
        () => undefined,
        (e: Error & { status?: number; code?: string }) => e,
      );
      assert.deepEqual(readdirSync(hostMarker), [], 'the host marker directory must stay empty');
      if (upload) {
        // The sandbox's own tar refuses to write through a symlink it just unpacked: a clean 400.
        assert.equal(upload.status, 400, upload.message);
        assert.equal(upload.code, 'INVALID_REQUEST');
      } else {
        assert.equal(
          await sb.files.readText(`${hostMarker}/pwned`),
          'pwned via symlink',
          'the file landed in the sandbox copy of the path',
        );
      }
      assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    });

    test('a tar file entry under a sandbox symlink to a host path lands inside the sandbox, never on the host', async () => {
      const name = hostMarker.split('/').pop()!;
      await sb.commands.run(`mkdir -p ${hostMarker} /tmp/evil4 && ln -sfn ${hostMarker} /tmp/evil4/evil`);
      const tar = encodeTar([{ name: 'evil/pwned-through-existing-link', type: 'file', mode: 0o644, data: 'landed inside' }]);
      await sb.files.uploadTar('/tmp/evil4', tar);
      assert.deepEqual(readdirSync(hostMarker), [], 'the host marker directory must stay empty');
      assert.equal((await sb.commands.run(`cat /var/tmp/${name}/pwned-through-existing-link`)).stdout, 'landed inside');
    });

    test('a tar symlink to `../../..` and files through it stay inside the sandbox root', async () => {
      const tar = encodeTar([
        { name: 'up', type: 'symlink', mode: 0o777, linkname: '../../../../../../..' },
        { name: `up${hostMarker}/through-dotdot`, type: 'file', mode: 0o644, data: 'dotdot' },
        { name: 'etcl', type: 'symlink', mode: 0o777, linkname: '/etc' },
        { name: 'etcl/dsec-engine-evil', type: 'file', mode: 0o644, data: 'evil' },
      ]);
      await sb.files.uploadTar('/tmp/evil2', tar).catch(() => undefined);
      assert.deepEqual(readdirSync(hostMarker), [], 'the host marker directory must stay empty');
      assert.equal(existsSync('/etc/dsec-engine-evil'), false, 'nothing written to the host /etc');
      const inSandbox = await sb.commands.run('cat /etc/dsec-engine-evil 2>/dev/null; true');
      assert.ok(inSandbox.stdout === '' || inSandbox.stdout === 'evil', 'whatever landed, landed in the sandbox /etc');
    });

    test('tar entries with `..` and absolute names do not escape the sandbox', async () => {
      const tar = encodeTar([
        { name: `../../../../../../..${hostMarker}/dotdot-name`, type: 'file', mode: 0o644, data: 'x' },
        { name: `${hostMarker}/absolute-name`, type: 'file', mode: 0o644, data: 'y' },
      ]);
      await sb.files.uploadTar('/tmp/evil3', tar).catch(() => undefined);
      assert.deepEqual(readdirSync(hostMarker), [], 'the host marker directory must stay empty');
      assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n', 'the sandbox still works');
    });

    test('a file written through a sandbox symlink that points at a host path stays in the sandbox', async () => {
      await sb.commands.run(`mkdir -p ${hostMarker} && ln -sfn ${hostMarker} /tmp/host-link`);
      await sb.files.write('/tmp/host-link/via-files-api', 'inside').catch(() => undefined);
      await sb.files.mkdir('/tmp/host-link/via-mkdir').catch(() => undefined);
      assert.deepEqual(readdirSync(hostMarker), []);
    });

    test('a corrupt tar upload fails with 400 INVALID_REQUEST and the sandbox is unharmed', async () => {
      await assert.rejects(
        sb.files.uploadTar('/tmp/bad-tar', Buffer.from('this is not a tar archive at all'.repeat(40))),
        (e: unknown) => (e as { status?: number }).status === 400,
      );
      assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    });

    test('file changes through the API are visible to commands and vice versa', async () => {
      await sb.files.write('/tmp/vis/api.txt', 'from api');
      assert.equal((await sb.commands.run('cat /tmp/vis/api.txt')).stdout, 'from api');
      await sb.commands.run('echo from-cmd > /tmp/vis/cmd.txt');
      assert.equal(await sb.files.readText('/tmp/vis/cmd.txt'), 'from-cmd\n');
    });
  });
