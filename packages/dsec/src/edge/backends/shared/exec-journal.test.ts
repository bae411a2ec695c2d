import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ExecJournal, type NotedProcess } from './exec-journal.js';

const entry = (id: string): NotedProcess => ({ kind: 'process', id, cmd: ['sleep', '1'], startedAt: new Date(0).toISOString() });

test("a closed journal writes nothing: an exit noted during the sandbox's teardown does not bring its dir back", () => {
  const root = mkdtempSync(join(tmpdir(), 'dsec-journal-'));
  try {
    const dir = join(root, 'sandbox', 'run', 'journal');
    const journal = new ExecJournal(dir);
    journal.note(entry('p-1'));
    assert.deepEqual(
      journal.read().map((n) => n.id),
      ['p-1'],
    );
    journal.close();
    rmSync(join(root, 'sandbox'), { recursive: true }); // the teardown removes the sandbox's dir
    journal.note({
      ...entry('p-1'),
      exit: { exitCode: 137, timedOut: false, killed: true, durationMs: 1, stdoutBytes: 0, stderrBytes: 0 },
    });
    assert.equal(existsSync(join(root, 'sandbox')), false, 'the note made the removed dir again');
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
