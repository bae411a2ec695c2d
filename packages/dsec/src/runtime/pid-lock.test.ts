import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { HostNotReadyError, takePidLock } from './pid-lock.js';

describe('takePidLock', () => {
  test('takes a free data dir, refuses one a live process holds, and takes over from a dead one', () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-pidlock-'));
    try {
      const release = takePidLock(dir, 'dsec-edge.pid', 'a dsec edge');
      assert.equal(readFileSync(join(dir, 'dsec-edge.pid'), 'utf8'), String(process.pid));
      release();
      assert.equal(existsSync(join(dir, 'dsec-edge.pid')), false);
      writeFileSync(join(dir, 'dsec.pid'), '1'); // PID 1 is always alive
      assert.throws(
        () => takePidLock(dir, 'dsec.pid', 'dsec'),
        (err: unknown) => err instanceof HostNotReadyError && /^dsec \(pid 1\) already runs on /.test(err.message),
      );
      writeFileSync(join(dir, 'dsec.pid'), '2147483646'); // no such process
      takePidLock(dir, 'dsec.pid', 'dsec')();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
