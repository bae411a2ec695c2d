/**
 * OCI image layout and `docker save` imports against a real server, from archives this test
 * writes itself (fixtures/oci.ts: its own ustar writer and digests): whiteouts and opaque dirs
 * of a second layer, config carried over, squash, digest checks, and hostile entries that must
 * not write anything outside the scratch directory.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { gzipSync } from 'node:zlib';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { ImportImageResult } from '@dsec/sdk/schema';
import { ImportError, importImage } from '../../src/image/oci-import.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';
import { type FixtureEntry, type FixtureImage, dockerSaveTar, sha256, ustar, writeOciLayout } from './fixtures/oci.js';

const BUSYBOX = readFileSync('/bin/busybox');

/** Layer 1: busybox with a few applets, /etc/passwd, and the paths layer 2 deletes or hides. */
function baseLayer(): FixtureEntry[] {
  return [
    { name: 'bin/', type: 'dir' },
    { name: 'bin/busybox', data: BUSYBOX, mode: 0o755 },
    ...['sh', 'ls', 'cat', 'test', 'id', 'pwd', 'env', 'stat', 'readlink'].map((a): FixtureEntry => ({
      name: `bin/${a}`,
      type: 'symlink',
      linkname: 'busybox',
    })),
    { name: 'etc/', type: 'dir' },
    { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:app:/home/app:/bin/sh\n' },
    { name: 'etc/group', data: 'root:x:0:\nstaff:x:50:\n' },
    { name: 'tmp/', type: 'dir', mode: 0o1777 },
    { name: 'gone.txt', data: 'deleted above' },
    { name: 'opq/', type: 'dir' },
    { name: 'opq/a', data: 'a' },
    { name: 'opq/b', data: 'b' },
    { name: 'opq/sub/', type: 'dir' },
    { name: 'opq/sub/deep', data: 'deep' },
    { name: 'keep/', type: 'dir' },
    { name: 'keep/x', data: 'x', uid: 1000, gid: 1001, mode: 0o640 },
    { name: 'keep/hard1', data: 'hard' },
    { name: 'keep/hard2', type: 'link', linkname: 'keep/hard1' },
    { name: 'keep/abs', type: 'symlink', linkname: '/etc/passwd' },
  ];
}

/** Layer 2: a whiteout, an opaque dir with one new entry, an added file. */
function upperLayer(): FixtureEntry[] {
  return [
    { name: '.wh.gone.txt', data: '' },
    { name: 'opq/', type: 'dir' },
    { name: 'opq/.wh..wh..opq', data: '' },
    { name: 'opq/c', data: 'c' },
    { name: 'keep/', type: 'dir' },
    { name: 'keep/y', data: 'y' },
  ];
}

const CONFIG: FixtureImage['config'] = {
  Env: ['PATH=/bin', 'GREETING=from-oci'],
  WorkingDir: '/keep',
  User: 'app',
  Entrypoint: ['/bin/sh', '-c'],
  Cmd: ['cat /keep/y'],
  Labels: { 'org.example.source': 'fixture' },
};

function image(extra: Partial<FixtureImage> = {}): FixtureImage {
  return { layers: [baseLayer(), upperLayer()], config: CONFIG, refName: 'fixture:1', ...extra };
}

/** Every file of a directory as a tar, paths relative to it. */
function dirTar(dir: string): Buffer {
  const entries: FixtureEntry[] = [];
  const walk = (d: string): void => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) {
        entries.push({ name: `${relative(dir, p)}/`, type: 'dir' });
        walk(p);
      } else entries.push({ name: relative(dir, p), data: readFileSync(p) });
    }
  };
  walk(dir);
  return ustar(entries);
}

async function sh(sb: Sandbox, script: string): Promise<string> {
  const r = await sb.commands.run(['/bin/sh', '-c', script]);
  assert.equal(r.exitCode, 0, `${script}: ${r.stderr}`);
  return r.stdout;
}

describe('image import (OCI layout, docker save)', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let work: string;

  before(async () => {
    server = await startTestServer();
    work = mkdtempSync('/var/tmp/dsec-import-fixtures-');
  });
  after(async () => {
    if (work) rmSync(work, { recursive: true, force: true });
    await server?.close();
  });

  /** Checks the merged tree and config of an imported image in a real sandbox. */
  async function checkImported(ref: string): Promise<void> {
    const info = server.dsec.images.info(server.dsec.images.resolve(ref)!)!;
    assert.equal(info.config.cwd, '/keep');
    assert.equal(info.config.user, '1000:1001', 'the user name was resolved through the image /etc/passwd');
    assert.ok(info.config.env.includes('GREETING=from-oci'));
    assert.deepEqual(info.config.entrypoint, ['/bin/sh', '-c']);
    assert.deepEqual(info.config.cmd, ['cat /keep/y']);
    assert.equal(info.config.labels['org.example.source'], 'fixture');
    const sb = await Sandbox.create({ ...server.conn, image: ref });
    try {
      assert.equal((await sb.commands.run('test -e /gone.txt')).exitCode, 1, 'the whited-out file is gone');
      assert.equal((await sh(sb, 'ls -A /opq')).trim(), 'c', 'the opaque dir shows only the upper layer entries');
      assert.equal((await sh(sb, 'ls -A /keep | sort | tr "\\n" " "')).trim(), 'abs hard1 hard2 x y');
      assert.equal((await sh(sb, 'pwd')).trim(), '/keep');
      assert.equal((await sh(sb, 'id -u; id -g')).trim(), '1000\n1001');
      assert.equal((await sh(sb, 'echo $GREETING')).trim(), 'from-oci');
      assert.equal((await sh(sb, 'stat -c "%u %g %a" /keep/x')).trim(), '1000 1001 640');
      assert.equal((await sh(sb, 'stat -c %h /keep/hard1; stat -c %i /keep/hard1 /keep/hard2 | sort -u | wc -l')).trim(), '2\n1');
      assert.equal((await sh(sb, 'readlink /keep/abs')).trim(), '/etc/passwd');
      assert.equal((await sh(sb, 'stat -c %a /tmp')).trim(), '1777');
    } finally {
      await sb.kill();
    }
  }

  test('POST /v1/images/import: an OCI layout (gzip layers) as a tar', async () => {
    const dir = join(work, 'oci-gz');
    writeOciLayout(dir, image({ gzip: true }));
    const res = await call(server, 'POST', '/v1/images/import?name=oci-gz', { body: dirTar(dir), contentType: 'application/x-tar' });
    assert.equal(res.status, 201, res.text);
    const body = res.json as ImportImageResult;
    assert.equal(body.format, 'oci-layout');
    assert.equal(body.sourceRef, 'fixture:1');
    assert.deepEqual(body.image.names, ['oci-gz:latest']);
    assert.equal(body.image.layers.length, 2);
    assert.equal(body.layers[1]!.whiteouts, 1);
    assert.equal(body.layers[1]!.opaqueDirs, 1);
    await checkImported('oci-gz');
  });

  test('a legacy docker save tarball, from a file (gzipped as a whole), with the name it carries', async () => {
    const file = join(work, 'save.tar.gz');
    writeFileSync(file, gzipSync(dockerSaveTar(image({ refName: 'docker.io/library/fixture:2' }))));
    const r = await importImage(server.dsec.images, file);
    assert.equal(r.format, 'docker-save');
    assert.equal(r.name, 'fixture:2');
    await checkImported('fixture:2');
  });

  test('the docker 25+ form (OCI layout plus manifest.json) imports through index.json; the same layers are reused', async () => {
    const dir = join(work, 'docker25');
    const d = writeOciLayout(dir, image());
    writeFileSync(
      join(dir, 'manifest.json'),
      JSON.stringify([
        {
          Config: `blobs/sha256/${d.config.slice(7)}`,
          RepoTags: ['fixture:25'],
          Layers: d.layers.map((l) => `blobs/sha256/${l.slice(7)}`),
        },
      ]),
    );
    const res = await call(server, 'POST', '/v1/images/import?name=docker25', { body: dirTar(dir), contentType: 'application/x-tar' });
    assert.equal(res.status, 201, res.text);
    const body = res.json as ImportImageResult;
    assert.equal(body.format, 'oci-layout');
    assert.deepEqual(
      body.layers.map((l) => l.cached),
      [true, true],
      'layers of an earlier import (same diff_ids) are reused',
    );
    await checkImported('docker25');
  });

  test('squash: one EROFS layer, whiteouts applied as deletions', async () => {
    const dir = join(work, 'squash');
    writeOciLayout(dir, image());
    const r = await importImage(server.dsec.images, dir, { name: 'squashed', squash: true });
    assert.equal(r.squashed, true);
    assert.equal(server.dsec.images.get(r.id)!.layers.length, 1);
    await checkImported('squashed');
  });

  test('a digest mismatch is a clear 400', async () => {
    const dir = join(work, 'corrupt');
    const d = writeOciLayout(dir, image());
    const blob = join(dir, 'blobs', 'sha256', d.layers[1]!.slice(7));
    writeFileSync(blob, ustar([{ name: 'evil', data: 'tampered' }]));
    const res = await call(server, 'POST', '/v1/images/import?name=corrupt', { body: dirTar(dir), contentType: 'application/x-tar' });
    const err = expectWireError(res, 400, 'INVALID_REQUEST');
    assert.match(err.message, /digest mismatch/);
    assert.match(err.message, new RegExp(d.layers[1]!));
    assert.equal(server.dsec.images.resolve('corrupt'), undefined, 'nothing was registered');

    // docker save: the layer no longer matches the config's diff_id.
    const save = dockerSaveTar(image());
    const tampered = Buffer.from(save.toString('latin1').replace('deleted above', 'DELETED ABOVE'), 'latin1');
    const res2 = await call(server, 'POST', '/v1/images/import', { body: tampered, contentType: 'application/x-tar' });
    assert.match(expectWireError(res2, 400, 'INVALID_REQUEST').message, /digest mismatch/);
  });

  test('an unknown user name and a non-archive are 400s', async () => {
    const dir = join(work, 'baduser');
    writeOciLayout(dir, image({ config: { ...CONFIG, User: 'nosuchuser' } }));
    const res = await call(server, 'POST', '/v1/images/import', { body: dirTar(dir), contentType: 'application/x-tar' });
    assert.match(expectWireError(res, 400, 'INVALID_REQUEST').message, /nosuchuser.*\/etc\/passwd/);
    const junk = await call(server, 'POST', '/v1/images/import', { body: randomBytes(4096), contentType: 'application/x-tar' });
    assert.match(expectWireError(junk, 400, 'INVALID_REQUEST').message, /not a tar archive/);
    await assert.rejects(importImage(server.dsec.images, work), ImportError);
  });

  test('hostile layer entries write nothing outside the scratch directory', async () => {
    const marker = `dsec-escape-${randomBytes(6).toString('hex')}`;
    const hostDir = join('/var/tmp', marker);
    mkdirSync(hostDir);
    const tmpDir = server.dsec.images.layers.tmpDir;
    try {
      const hostile: FixtureEntry[] = [
        { name: `../${marker}-dotdot`, data: 'x' },
        { name: `../../../../../../var/tmp/${marker}/climbed`, data: 'x' },
        { name: `/var/tmp/${marker}/absolute`, data: 'x' },
        { name: 'to-host', type: 'symlink', linkname: hostDir },
        { name: 'to-host/through-symlink', data: 'x' },
        { name: 'up', type: 'symlink', linkname: `../../../../../../var/tmp/${marker}` },
        { name: 'up/through-relative', data: 'x' },
        { name: 'fine', data: 'fine' },
      ];
      const dir = join(work, 'hostile');
      writeOciLayout(dir, { layers: [baseLayer(), hostile], config: { Cmd: ['/bin/sh'] } });
      const r = await importImage(server.dsec.images, dir, { name: 'hostile' });
      assert.deepEqual(readdirSync(hostDir), [], 'nothing landed in the host directory');
      for (const p of [join(tmpDir, '..', `${marker}-dotdot`), join(tmpDir, `${marker}-dotdot`), `/var/tmp/${marker}-dotdot`])
        assert.ok(!existsSync(p), p);
      assert.ok(
        r.warnings.some((w) => w.includes('outside the archive root')),
        JSON.stringify(r.warnings),
      );
      const sb = await Sandbox.create({ ...server.conn, image: 'hostile' });
      try {
        // Inside the image: the absolute name was made relative; symlinked parents became dirs.
        assert.equal(await sh(sb, 'cat /fine; echo; cat /var/tmp/*/absolute'), 'fine\nx');
        assert.equal((await sh(sb, 'test -d /to-host && test ! -L /to-host && ls /to-host')).trim(), 'through-symlink');
      } finally {
        await sb.kill();
      }
      // A hard link to a path outside the layer is refused outright.
      const dir2 = join(work, 'hostile-link');
      writeOciLayout(dir2, { layers: [[{ name: 'passwd-link', type: 'link', linkname: '../../../../etc/passwd' }]], config: {} });
      await assert.rejects(
        importImage(server.dsec.images, dir2, { name: 'hostile-link' }),
        (err: Error) => err instanceof ImportError && /outside the archive/.test(err.message),
      );
    } finally {
      rmSync(hostDir, { recursive: true, force: true });
    }
    assert.deepEqual(
      readdirSync(tmpDir).filter((n) => n.startsWith('import-')),
      [],
      'import scratch dirs are removed',
    );
  });

  test('the digests the fixtures compute are the ones dsec checks (sanity)', () => {
    const t = ustar([{ name: 'a', data: 'a' }]);
    assert.match(sha256(t), /^sha256:[0-9a-f]{64}$/);
  });
});
