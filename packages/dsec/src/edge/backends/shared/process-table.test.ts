import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApiError } from '../../../api-error.js';
import { CappedOutput } from './capped-output.js';
import type { CommandProcess, ProcessExit } from './command-process.js';
import { PROCESS_OUTPUT_BUDGET_BYTES, ProcessTable } from './process-table.js';

const MiB = 2 ** 20;

/** A process that is running until end() is called. */
function fakeProcess(cap: number): CommandProcess & { end(): Promise<void> } {
  let finish!: (e: ProcessExit) => void;
  const done = new Promise<ProcessExit>((r) => (finish = r));
  const proc = {
    stdout: new CappedOutput(cap),
    stderr: new CappedOutput(cap),
    done,
    startedAt: new Date(),
    exit: undefined as ProcessExit | undefined,
    onOutput: () => () => {},
    writeStdin: () => true,
    endStdin: () => {},
    pause: () => {},
    resume: () => {},
    signal: async () => {},
    kill: () => {},
    async end() {
      proc.exit = { exitCode: 0, timedOut: false, killed: false, durationMs: 1 };
      finish(proc.exit);
      await done;
      await new Promise((r) => setImmediate(r)); // add()'s then() has run
    },
  };
  return proc;
}

function start(table: ProcessTable, cap: number): { id: string; proc: ReturnType<typeof fakeProcess> } {
  const reservation = table.reserveOutput(cap);
  const proc = fakeProcess(cap);
  return { id: table.add(['yes'], proc, undefined, reservation).id, proc };
}

describe('ProcessTable output reservations', () => {
  test('two processes at the largest cap fit a sandbox, a third is refused before it starts; default caps always fit', () => {
    assert.equal(PROCESS_OUTPUT_BUDGET_BYTES, 256 * MiB);
    const table = new ProcessTable('sb-t');
    start(table, 64 * MiB);
    start(table, 64 * MiB);
    assert.throws(
      () => table.reserveOutput(64 * MiB),
      (err: unknown) =>
        err instanceof ApiError &&
        err.code === 'OUTPUT_BUDGET_EXCEEDED' &&
        /sandbox sb-t's background processes/.test(err.message) &&
        err.details['ownerHeldBytes'] === 252 * MiB,
    );
    for (let i = 0; i < 100; i++) start(table, 1 * MiB);
    assert.equal(table.list().length, 102);
  });

  test('an exited process is forgotten, oldest first, to make room; a running one never is', async () => {
    const table = new ProcessTable('sb-t');
    const a = start(table, 64 * MiB);
    const b = start(table, 64 * MiB);
    const small = start(table, 1 * MiB);
    await small.proc.end(); // exited, but reserved nothing: kept
    await b.proc.end();
    start(table, 64 * MiB); // b's room
    assert.throws(() => table.entry(b.id), /no process/);
    assert.equal(table.entry(a.id).id, a.id, 'a runs, so it stays');
    assert.equal(table.entry(small.id).id, small.id, 'a process that reserved nothing is not forgotten for room');
    assert.throws(() => table.reserveOutput(64 * MiB), /OUTPUT_BUDGET_EXCEEDED|maxOutputBytes/);
    await a.proc.end();
    table.reserveOutput(64 * MiB).release();
  });

  test('a process pruned past the 64 exited gives its reservation back', async () => {
    const table = new ProcessTable('sb-t');
    const big = start(table, 64 * MiB);
    await big.proc.end();
    for (let i = 0; i < 64; i++) await start(table, 1 * MiB).proc.end();
    assert.throws(() => table.entry(big.id), /no process/);
    start(table, 64 * MiB);
    start(table, 64 * MiB);
  });

  test('a start that cannot fit even so forgets nothing: exited processes that reserved nothing, or too little, stay', async () => {
    const table = new ProcessTable('sb-t');
    const smalls = [start(table, 1 * MiB), start(table, 1 * MiB)];
    for (const p of smalls) await p.proc.end();
    const big = start(table, 16 * MiB); // 30 MiB
    await big.proc.end();
    start(table, 64 * MiB); // 126 MiB, running
    start(table, 40 * MiB); // 78 MiB, running: 234 held
    // A 64 MiB start needs 126: forgetting every exited one frees 30, not enough.
    assert.throws(() => table.reserveOutput(64 * MiB), /OUTPUT_BUDGET_EXCEEDED|maxOutputBytes/);
    for (const p of [...smalls, big])
      assert.equal(table.entry(p.id).id, p.id, 'forgetting the exited one would not have made room: it stays');
  });
});
