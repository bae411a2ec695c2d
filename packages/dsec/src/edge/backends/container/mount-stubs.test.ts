import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { cgroupNames } from './oci-config.js';
import { existingDirs, prepareMountStubs } from './mount-stubs.js';

test('the stubs: an empty dir and a cgroup root with a dir per name, mode 0555; masked paths kept only where they are directories; a second start keeps them', () => {
  const nodeDir = mkdtempSync(join(tmpdir(), 'dsec-unit-stubs-'));
  try {
    const names = cgroupNames(['cpu,cpuacct', 'memory']);
    assert.deepEqual(names, ['cpu,cpuacct', 'memory', 'cpu', 'cpuacct']);
    const s = prepareMountStubs(names, join(nodeDir, 'stubs'));
    assert.deepEqual(
      existingDirs(['/proc/self', '/proc/kcore', '/no/such/dir']),
      ['/proc/self'],
      'a file (kcore) and an absent path are left to crun',
    );
    assert.deepEqual(readdirSync(s.emptyDir), []);
    assert.deepEqual(readdirSync(s.cgroupRoot).sort(), [...names].sort());
    for (const d of [s.emptyDir, s.cgroupRoot, join(s.cgroupRoot, 'memory')]) assert.equal(statSync(d).mode & 0o777, 0o555, d);
    // Something left in the empty dir would show in every sandbox's masked dirs: it is removed.
    rmSync(s.emptyDir, { recursive: true });
    mkdirSync(join(s.emptyDir, 'sub'), { recursive: true });
    writeFileSync(join(s.emptyDir, 'file'), 'x');
    const again = prepareMountStubs(['memory', 'pids'], join(nodeDir, 'stubs'));
    assert.deepEqual(readdirSync(again.emptyDir), []);
    // Names of an earlier start stay (a running sandbox may have a bind on one).
    assert.deepEqual(readdirSync(again.cgroupRoot).sort(), ['cpu', 'cpu,cpuacct', 'cpuacct', 'memory', 'pids']);
  } finally {
    rmSync(nodeDir, { recursive: true, force: true });
  }
});
