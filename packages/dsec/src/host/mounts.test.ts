import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { filesystemOf, mountsUnder, readMounts } from './mounts.js';
import { MS_NODEV, MS_NOSUID, mount, umount } from './syscalls.js';

describe('readMounts', () => {
  test('lists the root mount with its filesystem type', () => {
    const root = readMounts().find((m) => m.mountPoint === '/');
    assert.ok(root, 'no / in mountinfo');
    assert.ok(root.fsType.length > 0);
  });

  test('lists /proc as proc', () => {
    assert.equal(readMounts().find((m) => m.mountPoint === '/proc')?.fsType, 'proc');
  });
});

describe('mounts with awkward names (real tmpfs mounts)', { skip: process.getuid?.() === 0 ? undefined : 'mounting needs root' }, () => {
  let dir: string;
  const mounted: string[] = [];

  const tmpfs = (path: string): void => {
    mkdirSync(path, { recursive: true });
    mount('tmpfs', path, 'tmpfs', MS_NOSUID | MS_NODEV, 'size=1m');
    mounted.push(path);
  };

  before(() => {
    dir = mkdtempSync('/var/tmp/dsec-test-mounts-');
    tmpfs(`${dir}/with space`);
    tmpfs(`${dir}/tab\there`);
    tmpfs(`${dir}/back\\slash`);
    tmpfs(`${dir}/a`);
    tmpfs(`${dir}/a/nested`);
    tmpfs(`${dir}/ab`);
  });
  after(() => {
    for (const m of mounted.reverse()) {
      try {
        umount(m);
      } catch {
        // reported by the leak check of the runner
      }
    }
    if (readMounts().some((m) => m.mountPoint.startsWith(`${dir}/`))) throw new Error(`mounts left under ${dir}; not removing it`);
    rmSync(dir, { recursive: true, force: true });
  });

  test('a mount point with a space is unescaped (\\040)', () => {
    assert.ok(readMounts().some((m) => m.mountPoint === `${dir}/with space` && m.fsType === 'tmpfs'));
  });

  test('a mount point with a tab is unescaped (\\011)', () => {
    assert.ok(readMounts().some((m) => m.mountPoint === `${dir}/tab\there`));
  });

  test('a mount point with a backslash is unescaped (\\134)', () => {
    assert.ok(readMounts().some((m) => m.mountPoint === `${dir}/back\\slash`));
  });

  test('mountsUnder includes the dir itself and mounts below it, deepest last', () => {
    assert.deepEqual(
      mountsUnder(`${dir}/a`).map((m) => m.mountPoint),
      [`${dir}/a`, `${dir}/a/nested`],
    );
  });

  test('mountsUnder does not match a sibling sharing a prefix (a vs ab)', () => {
    assert.ok(!mountsUnder(`${dir}/a`).some((m) => m.mountPoint === `${dir}/ab`));
  });

  test('filesystemOf finds the deepest mount holding a path', () => {
    assert.equal(filesystemOf(`${dir}/a/nested/file`), 'tmpfs');
    assert.equal(filesystemOf(`${dir}/with space/x`), 'tmpfs');
  });

  test('filesystemOf a path beside a mount is not that mount (abc is not under ab)', () => {
    assert.equal(filesystemOf(`${dir}/abc`), filesystemOf('/var/tmp'));
    assert.notEqual(filesystemOf('/var/tmp'), 'unknown');
  });
});
