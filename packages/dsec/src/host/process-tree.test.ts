import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { killTree, processTree } from './process-tree.js';

/** True while `pid` runs; false once it is gone or only a zombie waiting to be reaped. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** Resolves when `check` holds, polling; the test timeout bounds the wait. */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 10));
}

describe('process trees', { timeout: 30_000 }, () => {
  test('processTree lists a process and all its descendants', async () => {
    const child = spawn('sh', ['-c', 'sleep 1000 & sh -c "sleep 1000 & wait" & wait'], { stdio: 'ignore' });
    const exited = new Promise((r) => child.on('exit', r));
    try {
      // sh, its sleep, the inner sh and the inner sleep
      await until(() => processTree(child.pid!).length >= 4);
      const tree = processTree(child.pid!);
      assert.equal(tree[0], child.pid);
      assert.equal(tree.length, 4);
    } finally {
      killTree(child.pid!);
      await exited;
    }
  });

  test('processTree lists the given pid first', () => {
    assert.equal(processTree(process.pid)[0], process.pid);
  });

  test('killTree kills the process and every descendant', async () => {
    const child = spawn('sh', ['-c', 'sleep 1000 & sleep 1000 & wait'], { stdio: 'ignore' });
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_c, s) => r(s)));
    await until(() => processTree(child.pid!).length >= 3);
    const tree = processTree(child.pid!);
    killTree(child.pid!);
    assert.equal(await exited, 'SIGKILL');
    // The children were SIGKILLed too: each is gone or a zombie (bounded by the test timeout).
    for (const pid of tree.slice(1)) await until(() => !running(pid));
  });

  test('killTree of a pid that no longer exists does not throw', () => {
    assert.doesNotThrow(() => killTree(2 ** 22 + 12345));
  });
});
