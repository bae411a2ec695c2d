/**
 * Tar reading on tar-stream against archives made by GNU tar (every format it writes: long names
 * and links, pax records, binary xattrs, sparse files) and against hostile archives made by hand
 * here (huge metadata, absurd sizes, bad numbers, hard links out of the tree), plus backpressure:
 * the reader never pulls a whole entry into memory.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  createReadStream,
  existsSync,
  linkSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { getXattr, setXattr } from '../../src/host/syscalls.js';
import { UnsafeArchiveError, extractTarSafely } from '../../src/image/oci/safe-extract.js';
import { TarFormatError, type TarHeader, readTar } from '../../src/image/oci/tar-reader.js';
import { tarArchive, type TarWriteEntry } from '../../src/image/oci/tar-writer.js';
import { DiffLimitError, MAX_PATH_BYTES } from '../../src/image/pack-diff.js';
import { makeScratchDir } from '../helpers/server.js';

const asRoot = process.getuid?.() === 0 ? undefined : 'xattrs on security.* and owners need root';

async function* once(buf: Buffer): AsyncGenerator<Buffer> {
  yield buf;
}

async function list(source: AsyncIterable<Buffer>): Promise<(TarHeader & { data: Buffer })[]> {
  const out = [];
  for await (const { header, body } of readTar(source)) {
    const chunks: Buffer[] = [];
    for await (const c of body) chunks.push(c);
    out.push({ ...header, data: Buffer.concat(chunks) });
  }
  return out;
}

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, '0') + '\0';
}

/** One raw header block; `fields` overwrite bytes at offsets (to plant hostile values). Checksum last. */
function block(name: string, typeflag: string, size: number, fields: [number, Buffer][] = []): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, 'utf8');
  h.write(octal(0o644, 8), 100, 'latin1');
  h.write(octal(0, 8), 108, 'latin1');
  h.write(octal(0, 8), 116, 'latin1');
  h.write(octal(size, 12), 124, 'latin1');
  h.write(octal(1_700_000_000, 12), 136, 'latin1');
  h.write(typeflag, 156, 'latin1');
  h.write('ustar\0', 257, 'latin1');
  h.write('00', 263, 'latin1');
  for (const [off, bytes] of fields) bytes.copy(h, off);
  h.write('        ', 148, 'latin1');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + ' ', 148, 'latin1');
  return h;
}

const pad = (data: Buffer): Buffer => Buffer.concat([data, Buffer.alloc((512 - (data.length % 512)) % 512)]);
const entry = (name: string, typeflag: string, data: Buffer, fields: [number, Buffer][] = []): Buffer =>
  Buffer.concat([block(name, typeflag, data.length, fields), pad(data)]);

function paxRecord(key: string, value: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), value, Buffer.from('\n')]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

const END = Buffer.alloc(1024);

describe('tar archives GNU tar writes, read through tar-stream', () => {
  let dir: string;
  const longDir = `${'d'.repeat(120)}/${'e'.repeat(120)}`;
  const longName = `${longDir}/${'f'.repeat(90)}`;
  const longTarget = `/${'t'.repeat(200)}`;
  before(() => {
    dir = makeScratchDir('tar-archives');
    const tree = join(dir, 'tree');
    mkdirSync(join(tree, longDir), { recursive: true });
    writeFileSync(join(tree, longName), 'long\n');
    symlinkSync(longTarget, join(tree, 'sym'));
    linkSync(join(tree, longName), join(tree, longDir, 'hard'));
    writeFileSync(join(tree, 'ünïcödé'), 'u');
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  for (const format of ['gnu', 'oldgnu', 'pax'] as const) {
    test(`--format=${format}: long names, long link targets, hard links to long names, UTF-8 names`, async () => {
      const file = join(dir, `${format}.tar`);
      execFileSync('tar', [`--format=${format}`, '--sort=name', '-cf', file, '-C', join(dir, 'tree'), '.']);
      const entries = await list(createReadStream(file));
      const byName = new Map(entries.map((e) => [e.name.replace(/^\.\//, ''), e]));
      assert.equal(byName.get(longName)?.type, 'file');
      assert.equal(byName.get(longName)?.data.toString(), 'long\n');
      assert.equal(byName.get('sym')?.type, 'symlink');
      assert.equal(byName.get('sym')?.linkname, longTarget);
      const hard = byName.get(`${longDir}/hard`) ?? byName.get(longName);
      assert.ok(
        entries.some(
          (e) => e.type === 'link' && e.linkname.replace(/^\.\//, '') === (hard === byName.get(longName) ? `${longDir}/hard` : longName),
        ),
      );
      assert.equal(byName.get('ünïcödé')?.data.toString(), 'u');
    });
  }

  for (const format of ['v7', 'ustar'] as const) {
    test(`--format=${format} (no GNU or pax records) reads`, async () => {
      const small = join(dir, 'small');
      mkdirSync(join(small, 'sub'), { recursive: true });
      writeFileSync(join(small, 'sub', 'a'), 'a');
      const file = join(dir, `${format}.tar`);
      execFileSync('tar', [`--format=${format}`, '-cf', file, '-C', small, 'sub']);
      const entries = await list(createReadStream(file));
      assert.deepEqual(
        entries.map((e) => [e.name, e.type, e.data.toString()]),
        [
          ['sub/', 'dir', ''],
          ['sub/a', 'file', 'a'],
        ],
      );
    });
  }

  test('pax: large owners from pax records', async () => {
    const file = join(dir, 'owners.tar');
    execFileSync('tar', ['--format=pax', '--owner=3000000', '--group=3000001', '-cf', file, '-C', join(dir, 'tree'), 'sym']);
    const [e] = await list(createReadStream(file));
    assert.equal(e!.uid, 3_000_000);
    assert.equal(e!.gid, 3_000_001);
  });

  test('tarArchive output is read by GNU tar as written', () => {
    const file = join(dir, 'written.tar');
    writeFileSync(
      file,
      tarArchive([
        { name: longName, type: 'file', mode: 0o640, uid: 0, gid: 0, mtime: 1, data: Buffer.from('x') },
        { name: 'ln', type: 'symlink', mode: 0o777, uid: 0, gid: 0, mtime: 1, linkname: longTarget },
      ]),
    );
    const listing = execFileSync('tar', ['-tvf', file], { encoding: 'utf8' });
    assert.match(listing, new RegExp(`-rw-r----- .* ${longName}\\n`));
    assert.match(listing, new RegExp(`ln -> ${longTarget}\\n`));
  });

  for (const format of ['gnu', 'pax'] as const) {
    test(`sparse files (--format=${format} -S) are refused, not imported without their content`, async () => {
      const sparseDir = join(dir, `sparse-${format}`);
      mkdirSync(sparseDir);
      writeFileSync(join(sparseDir, 'holes'), 'start');
      truncateSync(join(sparseDir, 'holes'), 8 << 20);
      const file = join(dir, `sparse-${format}.tar`);
      execFileSync('tar', [`--format=${format}`, '-S', '-cf', file, '-C', sparseDir, 'holes']);
      await assert.rejects(list(createReadStream(file)), (err: Error) => err instanceof TarFormatError && /sparse/.test(err.message));
    });
  }

  test('binary xattr values (security.capability with byte 0x80) are kept byte-exact', { skip: asRoot }, async () => {
    const src = join(dir, 'caps');
    mkdirSync(src);
    writeFileSync(join(src, 'bin'), 'elf');
    // vfs_cap_data v2, effective, permitted = cap_setpcap (bit 7) | cap_sys_nice (bit 23): bytes 0x80.
    const cap = Buffer.alloc(20);
    cap.writeUInt32LE(0x02000001, 0);
    cap.writeUInt32LE((1 << 23) | (1 << 7), 4);
    const user = Buffer.from([0x80, 0xff, 0x00, 0x41, 0xc3]);
    setXattr(join(src, 'bin'), 'security.capability', cap);
    setXattr(join(src, 'bin'), 'user.blob', user);
    const file = join(dir, 'caps.tar');
    execFileSync('tar', ['--format=pax', '--xattrs', '--xattrs-include=*', '-cf', file, '-C', src, 'bin']);
    const [e] = await list(createReadStream(file));
    assert.deepEqual(e!.xattrs.get('security.capability'), cap);
    assert.deepEqual(e!.xattrs.get('user.blob'), user);
    const root = join(dir, 'caps-out');
    mkdirSync(root);
    await extractTarSafely(createReadStream(file), root, { layer: true, label: 'caps', warn: () => {} });
    assert.deepEqual(getXattr(join(root, 'bin'), 'security.capability'), cap);
    assert.deepEqual(getXattr(join(root, 'bin'), 'user.blob'), user);
  });
});

describe('hostile tar archives', () => {
  const rejects = (buf: Buffer, re: RegExp): Promise<void> =>
    assert.rejects(list(once(buf)), (err: Error) => err instanceof TarFormatError && re.test(err.message));

  test('a pax header over 4 MiB is refused before it is buffered further', async () => {
    const huge = Buffer.alloc(5 << 20, 0x61);
    await rejects(Buffer.concat([block('PaxHeader', 'x', huge.length), pad(huge), entry('a', '0', Buffer.from('a')), END]), /too large/);
  });

  test('a GNU long name over 4 MiB is refused', async () => {
    const huge = Buffer.alloc(5 << 20, 0x61);
    await rejects(
      Buffer.concat([block('././@LongLink', 'L', huge.length), pad(huge), entry('a', '0', Buffer.from('a')), END]),
      /too large/,
    );
  });

  test('an absurd size (base-256, 2^52 bytes) ends as a truncated archive, nothing allocated for it', async () => {
    const size = Buffer.alloc(12);
    size.writeBigUInt64BE(2n ** 52n, 4);
    size[0] = 0x80;
    await rejects(Buffer.concat([block('big', '0', 0, [[124, size]]), Buffer.alloc(4096), END]), /truncated/);
  });

  test('negative and non-octal numbers are refused', async () => {
    for (const negative of [Buffer.alloc(8, 0xff), Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe])])
      await rejects(Buffer.concat([entry('neg', '0', Buffer.alloc(0), [[108, negative]]), END]), /uid field .* not a valid number/);
    await rejects(
      Buffer.concat([entry('nan', '0', Buffer.alloc(0), [[116, Buffer.from('9999999\0')]]), END]),
      /gid field .* not a valid number/,
    );
    const negSize = Buffer.alloc(12, 0xff);
    await rejects(
      Buffer.concat([block('negsize', '0', 0, [[124, negSize]]), END]),
      /negative or unreadable size|size field .* not a valid number/,
    );
  });

  test('malformed pax values are refused', async () => {
    const paxed = (records: Buffer): Buffer => Buffer.concat([entry('PaxHeader', 'x', records), entry('a', '0', Buffer.from('a')), END]);
    await rejects(paxed(paxRecord('uid', Buffer.from('-1'))), /bad pax uid/);
    await rejects(paxed(paxRecord('size', Buffer.from('1x'))), /bad pax size/);
    await rejects(paxed(Buffer.from('99999 path=a\n')), /malformed pax record/);
  });

  test('an unknown entry type (volume label) is refused, not skipped', async () => {
    await rejects(Buffer.concat([entry('label', 'V', Buffer.alloc(0)), END]), /type dsec does not read/);
  });

  test('garbage is not a tar archive; a stream cut in a header is truncated', async () => {
    await rejects(Buffer.alloc(1024, 0x41), /bad header checksum/);
    await rejects(entry('a', '0', Buffer.from('abc')).subarray(0, 300), /truncated/);
  });

  test('after the end marker: another archive is read on (tar --ignore-zeros), other bytes are an error', async () => {
    const first = Buffer.concat([entry('a', '0', Buffer.from('a')), END]);
    const names = (await list(once(Buffer.concat([first, entry('late', '0', Buffer.from('l')), END])))).map((e) => e.name);
    assert.deepEqual(names, ['a', 'late']);
    await rejects(Buffer.concat([first, Buffer.alloc(512, 0x41)]), /bad header checksum/);
  });

  test('a source error reaches the consumer as it is', async () => {
    const boom = new Error('the registry closed the connection');
    const source = (async function* () {
      yield block('a', '0', 4096);
      yield Buffer.alloc(100);
      throw boom;
    })();
    await assert.rejects(list(source), (err) => err === boom);
  });

  test('streaming: a 64 MiB entry is never pulled far ahead of its reader', async () => {
    const size = 64 << 20;
    let pulled = 0;
    const source = (async function* () {
      const header = block('big', '0', size);
      pulled += header.length;
      yield header;
      const chunk = Buffer.alloc(1 << 20, 0x5a);
      for (let i = 0; i < 64; i++) {
        pulled += chunk.length;
        yield chunk;
      }
      yield END;
    })();
    let read = 0;
    let maxAhead = 0;
    for await (const { header, body } of readTar(source)) {
      assert.equal(header.size, size);
      for await (const c of body) {
        read += c.length;
        maxAhead = Math.max(maxAhead, pulled - read);
        await new Promise((r) => setImmediate(r));
      }
    }
    assert.equal(read, size);
    assert.ok(maxAhead <= 4 << 20, `the reader pulled ${maxAhead} bytes ahead of the consumer`);
  });

  test('a consumer that stops early closes the source', async () => {
    let closed = false;
    const source = (async function* () {
      try {
        yield Buffer.concat([entry('a', '0', Buffer.from('a')), entry('b', '0', Buffer.from('b'))]);
        for (;;) yield Buffer.alloc(512, 0);
      } finally {
        closed = true;
      }
    })();
    for await (const { header } of readTar(source)) if (header.name === 'a') break;
    await new Promise((r) => setImmediate(r));
    assert.ok(closed);
  });
});

describe('hostile archives against safe extraction', { skip: asRoot }, () => {
  let dir: string;
  before(() => {
    dir = makeScratchDir('tar-hostile');
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  const extract = async (name: string, archive: Buffer): Promise<{ root: string; warnings: string[] }> => {
    const root = join(dir, name, 'root');
    mkdirSync(root, { recursive: true });
    const warnings: string[] = [];
    await extractTarSafely(once(archive), root, { layer: true, label: name, warn: (m) => warnings.push(m) });
    return { root, warnings };
  };

  test('GNU long names and pax paths that climb out are skipped; nothing lands outside', async () => {
    const climb = `a/${'../'.repeat(8)}escaped`;
    const archive = Buffer.concat([
      entry('././@LongLink', 'L', Buffer.from(`${climb}-gnu\0`)),
      entry('placeholder', '0', Buffer.from('x')),
      entry('PaxHeader', 'x', paxRecord('path', Buffer.from(`${climb}-pax`))),
      entry('placeholder2', '0', Buffer.from('y')),
      entry('kept', '0', Buffer.from('k')),
      END,
    ]);
    const { root, warnings } = await extract('climb', archive);
    assert.deepEqual(readdirSync(root), ['kept']);
    assert.deepEqual(readdirSync(join(dir, 'climb')), ['root']);
    assert.equal(warnings.filter((w) => /outside the archive root/.test(w)).length, 2);
  });

  test('hard links out of the tree, through a symlink, or to a directory are refused', async () => {
    const secret = join(dir, 'secret');
    writeFileSync(secret, 'host secret');
    const refused = (name: string, archive: Buffer): Promise<void> =>
      assert.rejects(extract(name, archive), (err: Error) => err instanceof UnsafeArchiveError);
    await refused('up', Buffer.concat([block('h', '1', 0, [[157, Buffer.from('../../secret')]]), END]));
    await refused(
      'via-symlink',
      Buffer.concat([block('s', '2', 0, [[157, Buffer.from(dir)]]), block('h', '1', 0, [[157, Buffer.from('s/secret')]]), END]),
    );
    await refused('to-dir', Buffer.concat([block('d/', '5', 0), block('h', '1', 0, [[157, Buffer.from('d')]]), END]));
    await refused('absent', Buffer.concat([block('h', '1', 0, [[157, Buffer.from('etc/passwd')]]), END]));
    assert.equal(readFileSync(secret, 'utf8'), 'host secret');
    assert.ok(!existsSync(join(dir, 'via-symlink', 'root', 'h')));
  });
  test("a snapshot layer's bounds (a VM's disk diff): entries with whiteouts, file bytes, path length, each a DiffLimitError before anything past it lands", async () => {
    const limits = { maxEntries: 5, maxBytes: 1000, maxPathBytes: MAX_PATH_BYTES };
    const run = async (name: string, entries: TarWriteEntry[]): Promise<string> => {
      const root = join(dir, name);
      mkdirSync(root, { recursive: true });
      await extractTarSafely(once(tarArchive(entries)), root, { layer: true, label: name, warn: () => {}, limits });
      return root;
    };
    const file = (n: string, bytes = 1): TarWriteEntry => ({
      name: n,
      type: 'file',
      mode: 0o644,
      uid: 0,
      gid: 0,
      mtime: 1,
      data: Buffer.alloc(bytes, 1),
    });
    // At the bound: accepted.
    const ok = await run('limits-ok', [file('a'), file('b'), file('.wh.c'), file('d', 997)]);
    assert.deepEqual(readdirSync(ok).sort(), ['a', 'b', 'c', 'd']);
    const tooMany = (err: Error): boolean => err instanceof DiffLimitError && err.details['maxEntries'] === 5;
    await assert.rejects(
      run(
        'limits-entries',
        ['a', 'b', 'c', 'd', 'e', 'f'].map((n) => file(n)),
      ),
      tooMany,
    );
    // Whiteouts are entries too (each is remembered until the end of the archive).
    await assert.rejects(
      run(
        'limits-whiteouts',
        ['a', 'b', 'c', 'd', 'e', 'f'].map((n) => file(`.wh.${n}`)),
      ),
      tooMany,
    );
    await assert.rejects(
      run('limits-bytes', [file('a', 600), file('b', 600)]),
      (err: Error) => err instanceof DiffLimitError && err.details['maxBytes'] === 1000,
    );
    assert.ok(!existsSync(join(dir, 'limits-bytes', 'b')), 'the file past the bound is never written');
    const deep = `${'d'.repeat(200)}/`.repeat(21);
    await assert.rejects(
      run('limits-path', [file(`${deep}x`)]),
      (err: Error) => err instanceof DiffLimitError && /path too long/.test(err.message),
    );
  });
});
