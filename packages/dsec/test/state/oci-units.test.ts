/** The import building blocks without a server: tar reading and writing, safe extraction, squash merging. */
import assert from 'node:assert/strict';
import { existsSync, lstatSync, mkdirSync, readFileSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { listXattrs } from '../../src/host/syscalls.js';
import { mergeLayerInto } from '../../src/image/oci/merge.js';
import { OPAQUE_XATTR, cleanArchivePath, extractTarSafely } from '../../src/image/oci/safe-extract.js';
import { readTar } from '../../src/image/oci/tar-reader.js';
import { tarArchive } from '../../src/image/oci/tar-writer.js';
import { type FixtureEntry, ustar } from './fixtures/oci.js';
import { makeScratchDir } from '../helpers/server.js';

/** Buffers as the async stream readTar takes. */
async function* chunks(...bufs: Buffer[]): AsyncGenerator<Buffer> {
  yield* bufs;
}

const asRoot = process.getuid?.() === 0 ? undefined : 'extraction keeps owners and makes whiteout devices: needs root';

async function entries(buf: Buffer): Promise<{ name: string; type: string; linkname: string; uid: number; data: string }[]> {
  const out = [];
  for await (const { header, body } of readTar(chunks(buf))) {
    const chunks: Buffer[] = [];
    for await (const c of body) chunks.push(c);
    out.push({ name: header.name, type: header.type, linkname: header.linkname, uid: header.uid, data: Buffer.concat(chunks).toString() });
  }
  return out;
}

describe('tar reader and writer', () => {
  test('round trip with long names (pax), long link names, big ids', async () => {
    const long = `${'d'.repeat(120)}/${'f'.repeat(130)}`;
    const buf = tarArchive([
      { name: 'dir', type: 'dir', mode: 0o755, uid: 0, gid: 0, mtime: 1 },
      { name: long, type: 'file', mode: 0o644, uid: 3_000_000, gid: 5, mtime: 1, data: Buffer.from('content') },
      { name: 'ln', type: 'symlink', mode: 0o777, uid: 0, gid: 0, mtime: 1, linkname: `/${'t'.repeat(150)}` },
      { name: 'ünï', type: 'file', mode: 0o600, uid: 0, gid: 0, mtime: 1, data: Buffer.alloc(0) },
    ]);
    assert.deepEqual(await entries(buf), [
      { name: 'dir/', type: 'dir', linkname: '', uid: 0, data: '' },
      { name: long, type: 'file', linkname: '', uid: 3_000_000, data: 'content' },
      { name: 'ln', type: 'symlink', linkname: `/${'t'.repeat(150)}`, uid: 0, data: '' },
      { name: 'ünï', type: 'file', linkname: '', uid: 0, data: '' },
    ]);
  });

  test('reads an independent ustar writer (prefix-split names), and skips unread bodies', async () => {
    const long = `${'p'.repeat(90)}/${'q'.repeat(60)}`;
    const buf = ustar([
      { name: long, data: 'x'.repeat(1000) },
      { name: 'after', data: 'y' },
    ]);
    const names: string[] = [];
    for await (const { header } of readTar(chunks(buf.subarray(0, 700), buf.subarray(700)))) names.push(header.name);
    assert.deepEqual(names, [long, 'after']);
  });

  test('a corrupt header is an error, not garbage', async () => {
    const buf = ustar([{ name: 'a', data: 'a' }]);
    buf[10] = 0x41;
    await assert.rejects(entries(buf), /bad header checksum/);
    await assert.rejects(entries(buf.subarray(0, 600)), /bad header checksum|truncated/);
  });

  test('cleanArchivePath', () => {
    assert.equal(cleanArchivePath('/a/./b//c/'), 'a/b/c');
    assert.equal(cleanArchivePath('a/../b'), 'b');
    assert.equal(cleanArchivePath('./'), '');
    assert.equal(cleanArchivePath('../x'), undefined);
    assert.equal(cleanArchivePath('a/../../x'), undefined);
  });
});

describe('safe extraction and squash merge', { skip: asRoot }, () => {
  let dir: string;
  before(() => {
    dir = makeScratchDir('oci-units');
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const extract = async (name: string, list: FixtureEntry[]): Promise<{ root: string; warnings: string[] }> => {
    const root = join(dir, name);
    mkdirSync(root);
    const warnings: string[] = [];
    await extractTarSafely(
      (async function* () {
        yield ustar(list);
      })(),
      root,
      { layer: true, label: name, warn: (m) => warnings.push(m) },
    );
    return { root, warnings };
  };

  test('OCI whiteouts become overlay whiteouts; a same-layer entry wins over its whiteout', async () => {
    const { root } = await extract('wh', [
      { name: 'a/.wh.gone', data: '' },
      { name: 'b/', type: 'dir' },
      { name: 'b/.wh..wh..opq', data: '' },
      { name: 'b/new', data: 'n' },
      { name: '.wh.c', data: '' },
      { name: 'c/', type: 'dir' },
      { name: 'c/inside', data: 'i' },
    ]);
    const gone = lstatSync(join(root, 'a/gone'));
    assert.ok(gone.isCharacterDevice() && gone.rdev === 0, 'a/gone is a char 0:0 whiteout');
    assert.ok(listXattrs(join(root, 'b')).includes(OPAQUE_XATTR));
    assert.deepEqual(readdirSync(join(root, 'b')), ['new']);
    assert.ok(listXattrs(join(root, 'c')).includes(OPAQUE_XATTR), 'a dir recreated in the layer that whites it out replaces the lower one');
    assert.ok(!existsSync(join(root, '.wh.c')));
  });

  test('symlinked parents are replaced, never followed; ".." entries are skipped', async () => {
    const outside = join(dir, 'outside');
    mkdirSync(outside);
    const { root, warnings } = await extract('hostile', [
      { name: 'sym', type: 'symlink', linkname: outside },
      { name: 'sym/f', data: 'x' },
      { name: '../outside/g', data: 'x' },
      { name: 'rel', type: 'symlink', linkname: '../outside' },
      { name: 'rel/h', data: 'x' },
      { name: 'keep', type: 'symlink', linkname: '/etc/shadow' },
    ]);
    assert.deepEqual(readdirSync(outside), []);
    assert.ok(lstatSync(join(root, 'sym')).isDirectory());
    assert.equal(readFileSync(join(root, 'sym/f'), 'utf8'), 'x');
    assert.equal(readlinkSync(join(root, 'keep')), '/etc/shadow', 'symlink targets are stored as they are');
    assert.equal(warnings.filter((w) => /replaced by a directory/.test(w)).length, 2);
    assert.ok(warnings.some((w) => /outside the archive root/.test(w)));
  });

  test('merge: whiteouts delete, opaque dirs replace, other dirs merge; no marks remain', async () => {
    const lower = await extract('lower', [
      { name: 'del', data: 'd' },
      { name: 'opq/', type: 'dir' },
      { name: 'opq/old', data: 'o' },
      { name: 'merge/', type: 'dir' },
      { name: 'merge/one', data: '1' },
    ]);
    const upper = await extract('upper', [
      { name: '.wh.del', data: '' },
      { name: 'opq/.wh..wh..opq', data: '' },
      { name: 'opq/new', data: 'n' },
      { name: 'opq/.wh.ghost', data: '' },
      { name: 'merge/two', data: '2', mode: 0o600 },
    ]);
    mergeLayerInto(lower.root, upper.root);
    assert.deepEqual(readdirSync(lower.root).sort(), ['merge', 'opq']);
    assert.deepEqual(readdirSync(join(lower.root, 'opq')), ['new']);
    assert.ok(!listXattrs(join(lower.root, 'opq')).includes(OPAQUE_XATTR));
    assert.deepEqual(readdirSync(join(lower.root, 'merge')).sort(), ['one', 'two']);
    assert.equal(lstatSync(join(lower.root, 'merge/two')).mode & 0o777, 0o600);
  });
});
