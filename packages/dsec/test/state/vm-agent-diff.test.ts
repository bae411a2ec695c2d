/**
 * The guest agent's disk diff (native/vm-agent.c `diff`) on the host, without a VM: its tar
 * writer is compiled with a small harness around it and run over an overlay-style upper tree,
 * and the edge's reader (image/oci/ safe extraction, layer mode) must give back the same layer
 * tree: whiteouts as char 0:0, the opaque mark, binary xattrs, hard links, symlinks, FIFOs, long
 * names; scrub paths and sockets left out. GNU tar reads the archive too. The VM test
 * (vm.test.ts, "snapshot as an image") runs the same code in a guest end to end.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { lstatSync, mkdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, linkSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { getXattr, listXattrs, mknod, setXattr } from '../../src/host/syscalls.js';
import { which } from '../../src/host/doctor.js';
import { extractTarSafely } from '../../src/image/oci/safe-extract.js';
import { makeScratchDir } from '../helpers/server.js';

const agentSource = join(dirname(fileURLToPath(import.meta.url)), '../../../native/vm-agent.c');
const skip =
  process.getuid?.() !== 0
    ? 'whiteouts (mknod) and trusted.* xattrs need root'
    : !which('gcc')
      ? 'needs gcc (scripts/setup installs it)'
      : undefined;

const HARNESS = `
#define main agent_main
#include "${agentSource}"
#undef main
/* argv[1]: the upper directory; argv[2..]: scrub paths. The archive goes to stdout, as in the guest. */
int main(int argc, char **argv) {
  static struct jval scrub = {.key = "scrub", .type = 'a'};
  scrub.arr = argv + 2;
  scrub.n = argc - 2;
  tar_scrub = &scrub;
  if (chdir(argv[1]) < 0) return 1;
  tar_walk("");
  tar_zeros(1024);
  return 0;
}
`;

describe('the guest agent diff: a tar of the overlay upper the edge reads back as the same layer', { skip }, () => {
  let dir: string;
  let bin: string;
  before(() => {
    dir = makeScratchDir('agent-diff');
    writeFileSync(join(dir, 'harness.c'), HARNESS);
    bin = join(dir, 'diff');
    execFileSync('gcc', ['-O1', '-w', '-o', bin, join(dir, 'harness.c')]);
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('whiteouts, opaque dirs, xattrs, links, FIFOs and long names round-trip; scrub paths and sockets are left out', async () => {
    const upper = join(dir, 'upper');
    const long = 'n'.repeat(180);
    mkdirSync(join(upper, 'etc/sub'), { recursive: true });
    mkdirSync(join(upper, 'opaque/inner'), { recursive: true });
    mkdirSync(join(upper, 'root/.cache'), { recursive: true });
    writeFileSync(join(upper, 'etc/sub/file'), 'content');
    linkSync(join(upper, 'etc/sub/file'), join(upper, 'etc/hard'));
    symlinkSync('sub/file', join(upper, 'etc/link'));
    mknod(join(upper, 'etc/gone'), 0o020000, 0); // an overlay whiteout
    execFileSync('mkfifo', [join(upper, 'etc/fifo')]);
    setXattr(join(upper, 'opaque'), 'trusted.overlay.opaque', Buffer.from('y'));
    setXattr(join(upper, 'etc/sub/file'), 'user.bin', Buffer.from([0x80, 0, 0xff]));
    setXattr(join(upper, 'etc/sub'), 'trusted.overlay.impure', Buffer.from('y'));
    writeFileSync(join(upper, 'opaque/inner', long), 'deep');
    writeFileSync(join(upper, 'root/.cache/x'), 'scrubbed');
    const sock = createServer().listen(join(upper, 'etc/sock'));
    await new Promise((r) => sock.once('listening', r));

    const run = spawnSync(bin, [upper, '/root/.cache'], { maxBuffer: 64 << 20 });
    sock.close();
    assert.equal(run.status, 0, run.stderr.toString());
    const archive = run.stdout;
    const names = execFileSync('tar', ['-tf', '-'], { input: archive }).toString().trim().split('\n').sort();
    assert.ok(names.includes('etc/.wh.gone') && names.includes('opaque/.wh..wh..opq'), names.join(' '));
    assert.ok(!names.some((n) => n.startsWith('root/.cache/') || n === 'etc/sock'), names.join(' '));

    const out = join(dir, 'layer');
    mkdirSync(out);
    const warnings: string[] = [];
    const stats = await extractTarSafely(
      (async function* () {
        yield archive;
      })(),
      out,
      { layer: true, label: 'agent diff', warn: (m) => warnings.push(m) },
    );
    assert.deepEqual(warnings, []);
    assert.equal(stats.whiteouts, 1);
    assert.equal(stats.opaqueDirs, 1);
    const gone = lstatSync(join(out, 'etc/gone'));
    assert.ok(gone.isCharacterDevice() && gone.rdev === 0, 'the whiteout is char 0:0 again');
    assert.deepEqual(getXattr(join(out, 'opaque'), 'trusted.overlay.opaque'), Buffer.from('y'));
    assert.deepEqual(getXattr(join(out, 'etc/sub/file'), 'user.bin'), Buffer.from([0x80, 0, 0xff]), 'binary xattr, byte-exact');
    assert.ok(!listXattrs(join(out, 'etc/sub')).includes('trusted.overlay.impure'), 'overlay bookkeeping is left out');
    assert.equal(readFileSync(join(out, 'etc/sub/file'), 'utf8'), 'content');
    assert.equal(lstatSync(join(out, 'etc/hard')).ino, lstatSync(join(out, 'etc/sub/file')).ino, 'a hard link stays one inode');
    assert.equal(readlinkSync(join(out, 'etc/link')), 'sub/file');
    assert.ok(lstatSync(join(out, 'etc/fifo')).isFIFO());
    assert.equal(readFileSync(join(out, 'opaque/inner', long), 'utf8'), 'deep');
    assert.ok(!existsSync(join(out, 'root/.cache/x')) && !existsSync(join(out, 'etc/sock')));
  });
});
