/**
 * Disk full: dsec's data dir on a small filesystem of its own (a 160 MiB tmpfs this test mounts),
 * filled with a file. Below the edge's free-space floor a create is refused at admission (507
 * NODE_DISK_FULL, nothing made); with the disk wholly full, uploads, snapshots and imports fail
 * with 507 NODE_DISK_FULL too, never a 500, a crash or a half-made sandbox. After the file is
 * removed everything works again, and nothing is corrupted: SQLite passes integrity_check, every
 * image manifest parses and its layers match their digests, the layer cache's files match theirs.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import Database from 'better-sqlite3';
import { DsecError, Sandbox } from '@dsec/sdk';
import { freeBytes } from '../../src/host/disk-space.js';
import { runTool } from '../../src/host/run-tool.js';
import { MS_NOSUID, mount, umount } from '../../src/host/syscalls.js';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore, sha256File } from '../../src/image/layer-store.js';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, mountsBelow, newEdgeId, startDsec } from '../helpers/server.js';
import { TEST_STORE_POSTGRES } from '../helpers/postgres.js';
import { call } from '../helpers/wire.js';
import { dockerSaveTar } from '../state/fixtures/oci.js';

const skip = integrationSkipReason() ?? (TEST_STORE_POSTGRES ? 'checks the SQLite store on the full disk' : undefined);
const MIB = 1024 * 1024;
const FLOOR_MIB = 32;

/** A docker-save archive of a one-layer image: busybox and a shell (about 1 MiB). */
function smallImageTar(name: string): Buffer {
  return dockerSaveTar({
    layers: [
      [
        { name: 'bin/', type: 'dir' },
        { name: 'bin/busybox', data: readFileSync('/bin/busybox'), mode: 0o755 },
        { name: 'bin/sh', type: 'symlink', linkname: 'busybox' },
      ],
    ],
    config: { Cmd: ['/bin/sh'] },
    refName: `docker.io/library/${name}:1`,
  });
}

/**
 * Fills the filesystem of `dir` with files `<prefix>.N` until at most `leaveBytes` are free
 * (fallocate: no data written). dsec writes meanwhile, so a size that no longer fits is halved.
 */
async function fill(prefix: string, dir: string, leaveBytes: number): Promise<void> {
  for (let n = 0, size = freeBytes(dir) - leaveBytes; size >= 4096 && n < 64; n++) {
    const r = await runTool('fallocate', ['-l', String(size), `${prefix}.${n}`]);
    if (r.code !== 0) rmSync(`${prefix}.${n}`, { force: true });
    size = r.code === 0 ? freeBytes(dir) - leaveBytes : Math.floor(size / 2);
  }
}

/** A call's outcome as the API gives it: ok, or the error's status and code. */
async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    if (err instanceof DsecError) return `${err.status} ${err.code}: ${err.message}`;
    throw err;
  }
}

describe('disk full: the data dir on a filesystem of its own', { skip, timeout: 600_000 }, () => {
  test('creates, uploads, snapshots and imports fail with 507 NODE_DISK_FULL; after space is freed all works and nothing is corrupt', async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    // The test's own small filesystem; assertCleanAndRemove unmounts a tmpfs at the data dir.
    mount('tmpfs', dataDir, 'tmpfs', MS_NOSUID, 'size=160m,mode=0711');
    let dsec: RunningDsec | undefined;
    let passed = false;
    try {
      await fullDiskScenario();
      passed = true;
    } finally {
      // On a failure, the test's own tmpfs is removed when nothing else is mounted below it.
      if (!passed && mountsBelow(dataDir).length === 1) {
        umount(dataDir);
        rmSync(dataDir, { recursive: true, force: true });
      }
    }

    async function fullDiskScenario(): Promise<void> {
      try {
        dsec = await startDsec(dataDir, { edgeId, minFreeDiskMiB: FLOOR_MIB });
        const conn = { url: dsec.url, apiKey: dsec.apiKey };
        const sb = await Sandbox.create({ ...conn, image: 'busybox' });
        await sb.files.write('/before.txt', 'before');
        const filler = join(dataDir, 'filler');
        const sandboxDirs = (): string[] => readdirSync(join(dataDir, 'node', 'sandboxes')).sort();
        const dirsBefore = sandboxDirs();

        // 1. Below the floor, not yet full: a create is refused before anything is made.
        await fill(filler, dataDir, 16 * MIB);
        const refused = await outcome(Sandbox.create({ ...conn, image: 'busybox' }));
        assert.match(refused, /^507 NODE_DISK_FULL: .*MiB free under .*below the 32 MiB.*--min-free-disk-mib.*free space on the node/);
        assert.deepEqual(
          (await Sandbox.list(conn)).map((s) => s.id),
          [sb.id],
          'the refused create left no sandbox row',
        );
        assert.deepEqual(sandboxDirs(), dirsBefore, 'the refused create left no sandbox directory');

        // 2. Wholly full: every call that must write says so with the same code.
        await fill(`${filler}-full`, dataDir, 0);
        const upload = await outcome(sb.files.write('/big.bin', Buffer.alloc(2 * MIB, 1)));
        assert.match(upload, /^507 NODE_DISK_FULL: the node's disk is full writing \/big\.bin; free space on the node/);
        const snapshot = await outcome(sb.snapshot());
        assert.match(snapshot, /^507 NODE_DISK_FULL: /);
        const imported = await call(conn, 'POST', '/v1/images/import', {
          body: smallImageTar('diskfull'),
          contentType: 'application/x-tar',
        });
        assert.equal(imported.status, 507, imported.text);
        assert.equal((imported.json as { error: { code: string } }).error.code, 'NODE_DISK_FULL');
        assert.match(await outcome(Sandbox.create({ ...conn, image: 'busybox' })), /^507 NODE_DISK_FULL/);
        // A command: refused with the same code when its bookkeeping (the store's activity stamp, the
        // trajectory) cannot be written; when it runs, its own write into the full disk fails in the sandbox.
        const ran = await sb.commands.run(['sh', '-c', 'echo out; echo data > /in-sandbox.txt']).then(
          (r) => r,
          (err: unknown) => err,
        );
        if (ran instanceof DsecError)
          assert.match(
            `${ran.status} ${ran.code}: ${ran.message}`,
            /^507 NODE_DISK_FULL: .*(database or disk is full|no space left on device)/i,
          );
        else {
          const r = ran as Awaited<ReturnType<typeof sb.commands.run>>;
          assert.equal(r.stdout, 'out\n');
          assert.notEqual(r.exitCode, 0);
          assert.match(r.stderr, /No space left on device/);
        }
        assert.equal(Buffer.from(await sb.files.read('/before.txt')).toString(), 'before', 'reads still work');
        assert.equal((await Sandbox.list(conn)).length, 1);
        assert.deepEqual(sandboxDirs(), dirsBefore);

        // 3. Space freed: everything works again.
        for (const f of readdirSync(dataDir)) if (f.startsWith('filler')) rmSync(join(dataDir, f));
        const sb2 = await Sandbox.create({ ...conn, image: 'busybox' });
        assert.equal((await sb2.commands.run(['echo', 'again'])).stdout, 'again\n');
        await sb.files.write('/big.bin', Buffer.alloc(2 * MIB, 1));
        assert.equal((await sb.files.read('/big.bin')).length, 2 * MIB);
        const snap = await sb.snapshot();
        const fromSnap = await Sandbox.create({ ...conn, image: snap.imageId });
        assert.equal((await fromSnap.commands.run(['cat', '/before.txt'])).stdout, 'before');
        const again = await call(conn, 'POST', '/v1/images/import', { body: smallImageTar('diskfull'), contentType: 'application/x-tar' });
        assert.equal(again.status, 201, again.text);
        for (const s of [sb, sb2, fromSnap]) await s.kill();
      } finally {
        await dsec?.close({ killAll: true });
      }

      // 4. Nothing is corrupted.
      const db = new Database(join(dataDir, 'state.db'), { readonly: true });
      try {
        assert.equal(db.pragma('integrity_check', { simple: true }), 'ok');
      } finally {
        db.close();
      }
      const layers = new LayerStore(dataDir);
      const images = new ImageStore(dataDir, layers);
      const list = images.list(); // a manifest that does not parse throws, naming its file
      assert.ok(
        list.some((i) => i.names.includes('diskfull:1')),
        'the import after the disk was freed is there',
      );
      for (const img of list) {
        for (const digest of img.layers)
          assert.equal(await sha256File(layers.path(digest as `sha256:${string}`)), digest, `image ${img.id}'s layer ${digest}`);
      }
      const cache = join(dataDir, 'node', 'layer-cache');
      for (const f of readdirSync(cache)) {
        const p = join(cache, f);
        if (!statSync(p).isFile()) {
          assert.deepEqual(readdirSync(p), [], `${p}: copies in progress left behind`);
          continue;
        }
        assert.equal(await sha256File(p), `sha256:${f.replace(/\.erofs$/, '')}`, `layer cache file ${f}`);
      }
      await assertCleanAndRemove(dataDir, edgeId);
    }
  });
});
