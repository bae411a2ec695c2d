import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { ownerGone, ownerTag, PID_SPACE, processStartTime } from '../host/process-owner.js';
import { stagingOwnerGone, stagingPrefix, sweepDeadStaging } from './staging.js';

/** A pid that has exited (a child already reaped). */
function deadPid(): number {
  return spawnSync('true').pid!;
}

describe('staging scratch and owner processes', () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-staging-test-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('an owner tag names this process; one of a process that exited is gone; another pid space is not judged', () => {
    const tag = ownerTag();
    assert.equal(ownerGone(tag), false);
    const [boot, rest] = tag.split('/') as [string, string];
    const start = rest.split('.')[1]!;
    assert.equal(ownerGone(`${boot}/${deadPid()}.${start}`), true);
    // Same pid, another start time: the pid was reused, the owner is gone.
    assert.equal(ownerGone(`${boot}/${process.pid}.${Number(start) + 1}`), true);
    assert.equal(ownerGone(`000000000000/${deadPid()}.1`), false);
    assert.equal(ownerGone('not a tag'), false);
  });

  test('the sweep removes the scratch of dead owners only, and never a name without an owner', () => {
    const mine = join(dir, `${stagingPrefix('import')}abc`);
    const dead = join(dir, `import-${deadPid()}.${processStartTime(process.pid)}.${PID_SPACE}-abc`);
    const deadBlob = join(dir, `blob-${deadPid()}.1.${PID_SPACE}-0011.erofs`);
    const elsewhere = join(dir, `import-${deadPid()}.1.000000000000-abc`);
    mkdirSync(elsewhere);
    const legacy = join(dir, 'import-XyZ123');
    for (const d of [mine, dead, legacy]) mkdirSync(join(d, 'sub'), { recursive: true });
    writeFileSync(deadBlob, 'x');
    assert.equal(stagingOwnerGone(legacy.slice(dir.length + 1)), false);
    assert.deepEqual(sweepDeadStaging(dir).sort(), [deadBlob, dead].map((p) => p.slice(dir.length + 1)).sort());
    assert.ok(existsSync(mine) && existsSync(legacy) && existsSync(elsewhere) && !existsSync(dead) && !existsSync(deadBlob));
  });
});
