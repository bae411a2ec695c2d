import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, mock, test } from 'node:test';
import { ExecJournal } from '../../src/edge/backends/shared/exec-journal.js';
import { SESSION_COUNT_NOTE_DELAY_MS, SessionTable } from '../../src/edge/backends/shared/session-table.js';
import { ShellSession } from '../../src/edge/backends/shared/shell-session.js';
import { hostShellSessionHost } from './support/host-shell.js';

let root: string;
let journal: ExecJournal;
let table: SessionTable;

beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'dsec-session-table-'));
  journal = new ExecJournal(join(root, 'journal'));
  table = new SessionTable('sb-test', journal);
  // Only setTimeout: the session's shells are real processes, their pipes real I/O.
  mock.timers.enable({ apis: ['setTimeout'] });
});

afterEach(() => {
  mock.timers.reset();
  rmSync(root, { recursive: true, force: true });
});

const notedCount = (id: string): number | undefined => {
  const n = journal.read().find((e) => e.id === id);
  return n?.kind === 'session' ? n.commands : undefined;
};

test("a session's command count is noted after its commands' answers, once per delay, not on each answer's path", async () => {
  const s = new ShellSession(hostShellSessionHost(), {}, false);
  table.add(s);
  assert.equal(notedCount(s.id), 0, 'noted at open');
  for (let i = 0; i < 3; i++) assert.equal((await table.exec(s.id, { cmd: 'true' })).exitCode, 0);
  assert.equal(notedCount(s.id), 0, 'three answers and still the count of the open: none wrote the journal');
  mock.timers.tick(SESSION_COUNT_NOTE_DELAY_MS);
  assert.equal(notedCount(s.id), 3, 'the count noted once the delay has passed');
  await table.exec(s.id, { cmd: 'true' });
  mock.timers.tick(SESSION_COUNT_NOTE_DELAY_MS);
  assert.equal(notedCount(s.id), 4);
  await table.close(s.id);
});

test('a session closed before its count is noted stays forgotten (the pending note does not bring it back)', async () => {
  const s = new ShellSession(hostShellSessionHost(), {}, false);
  table.add(s);
  await table.exec(s.id, { cmd: 'true' });
  await table.close(s.id);
  mock.timers.tick(SESSION_COUNT_NOTE_DELAY_MS);
  assert.equal(
    journal.read().some((e) => e.id === s.id),
    false,
  );
});

test("an edge's stop notes the pending counts at once and leaves no timer to write after it (vm.test: a restarted edge removed the VM's dir, the old edge's timer made it again)", async () => {
  const s = new ShellSession(hostShellSessionHost(), {}, false);
  table.add(s);
  await table.exec(s.id, { cmd: 'true' });
  await table.exec(s.id, { cmd: 'true' });
  table.flushNotes();
  assert.equal(notedCount(s.id), 2, 'the count noted at the stop');
  rmSync(journal.dir, { recursive: true, force: true }); // what the next edge does with a sandbox gone
  mock.timers.tick(SESSION_COUNT_NOTE_DELAY_MS);
  assert.equal(existsSync(journal.dir), false, 'nothing wrote the journal after the stop');
  await s.close();
});
