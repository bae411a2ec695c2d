import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { mount, umount } from '../host/syscalls.js';
import { buildErofs } from './erofs.js';

const skip =
  process.getuid?.() !== 0
    ? 'needs root (a tmpfs and an erofs mount)'
    : spawnSync('mkfs.erofs', ['--help']).error
      ? 'mkfs.erofs is not installed (erofs-utils)'
      : undefined;

for (const srcBase of ['/var/tmp', '/tmp'])
  test(
    `a chunked image (sparse files) builds where /tmp is another filesystem than the image, from a source under ${srcBase}`,
    { skip },
    async () => {
      // The image on a tmpfs of its own, so never /tmp's filesystem: mkfs.erofs 1.5's copy from its
      // /tmp O_TMPFILE into the image failed there with EXDEV ("[Error 5] Input/output error").
      const out = mkdtempSync('/var/tmp/dsec-unit-erofs-');
      const src = mkdtempSync(`${srcBase}/dsec-unit-erofs-src-`);
      mount('tmpfs', out, 'tmpfs', 0, 'size=64m');
      const mnt = join(out, 'mnt');
      try {
        assert.notEqual(statSync(out).dev, statSync('/tmp').dev);
        writeFileSync(join(src, 'data'), 'some bytes\n');
        mkdirSync(join(src, 'sub'));
        writeFileSync(join(src, 'sub', 'sparse'), '');
        truncateSync(join(src, 'sub', 'sparse'), 64 << 20); // 64 MiB of holes
        const blob = join(out, 'layer.erofs');
        await buildErofs(src, blob, { compression: 'none', chunked: true });
        assert.ok(statSync(blob).size < 4 << 20, `the holes take no space: ${statSync(blob).size} bytes`);
        mkdirSync(mnt);
        const m = spawnSync('mount', ['-t', 'erofs', '-o', 'ro,loop', blob, mnt], { encoding: 'utf8' });
        assert.equal(m.status, 0, m.stderr);
        assert.equal(readFileSync(join(mnt, 'data'), 'utf8'), 'some bytes\n');
        assert.equal(statSync(join(mnt, 'sub', 'sparse')).size, 64 << 20);
        assert.equal(
          readFileSync(join(mnt, 'sub', 'sparse'))
            .subarray(0, 4096)
            .every((b) => b === 0),
          true,
        );
      } finally {
        spawnSync('umount', [mnt]);
        umount(out);
        rmSync(out, { recursive: true, force: true });
        rmSync(src, { recursive: true, force: true });
      }
    },
  );
