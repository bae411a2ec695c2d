import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { withFsIds } from './fs-ids.js';

/** The calling thread's ids as the kernel reports them: Uid/Gid lines (real, effective, saved, fs), Groups, CapEff. */
function threadIds(): { uid: string; gid: string; groups: string; capEff: string } {
  const status = readFileSync('/proc/thread-self/status', 'utf8');
  const line = (key: string): string => (new RegExp(`^${key}:\\s*(.*)$`, 'm').exec(status)?.[1] ?? '').trim().replace(/\s+/g, ' ');
  return { uid: line('Uid'), gid: line('Gid'), groups: line('Groups'), capEff: line('CapEff') };
}

const fsField = (ids: string): string => ids.split(' ')[3] ?? '';

describe('withFsIds', { skip: process.getuid?.() === 0 ? false : 'needs root (setfsuid, setgroups)' }, () => {
  test('inside: the thread checks files as the user (fsuid, fsgid, groups); after: root again with every capability', () => {
    const before = threadIds();
    const seen = withFsIds({ uid: 4321, gid: 4322, groups: [4323, 4324] }, threadIds);
    assert.equal(fsField(seen.uid), '4321');
    assert.equal(fsField(seen.gid), '4322');
    assert.equal(seen.groups, '4323 4324');
    assert.equal(seen.uid.split(' ')[1], '0', 'the effective uid is not changed, only the filesystem one');
    assert.notEqual(seen.capEff, before.capEff, 'the fs capabilities leave the effective set');
    assert.deepEqual(threadIds(), before);
  });

  test('an error thrown in the middle leaves the thread with root ids and its own groups', () => {
    const before = threadIds();
    assert.throws(
      () =>
        withFsIds({ uid: 1000, gid: 1000, groups: [] }, () => {
          throw new Error('mid-operation');
        }),
      /mid-operation/,
    );
    assert.deepEqual(threadIds(), before);
    assert.equal(fsField(before.uid), '0');
  });

  test('the kernel decides as for the user: a 0600 root file is unreadable, a file made is the user’s', () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-fsids-'));
    try {
      chmodSync(dir, 0o777);
      writeFileSync(join(dir, 'secret'), 'x', { mode: 0o600 });
      withFsIds({ uid: 4321, gid: 4322, groups: [] }, () => {
        assert.throws(() => readFileSync(join(dir, 'secret')), { code: 'EACCES' });
        writeFileSync(join(dir, 'mine'), 'y');
      });
      const st = statSync(join(dir, 'mine'));
      assert.deepEqual([st.uid, st.gid], [4321, 4322]);
      assert.equal(readFileSync(join(dir, 'secret'), 'utf8'), 'x', 'root reads it again afterwards');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
