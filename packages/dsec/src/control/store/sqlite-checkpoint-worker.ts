import { statSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import type { CheckpointerData } from './sqlite-checkpointer.js';

/**
 * The checkpointer's thread (sqlite-checkpointer.ts): its own connection to the database, which
 * copies the WAL back into the database file whenever the WAL has grown past the threshold. The
 * copy and its fsyncs block this thread only.
 */
const { file, everyMs, minWalBytes } = workerData as CheckpointerData;
const db = new Database(file);
db.pragma('busy_timeout = 5000');
// This connection never writes rows; it must not checkpoint on a commit of its own either.
db.pragma('wal_autocheckpoint = 0');

function walBytes(): number {
  try {
    return statSync(`${file}-wal`).size;
  } catch {
    return 0;
  }
}

let checkpoints = 0;
const timer = setInterval(() => {
  if (walBytes() < minWalBytes) return;
  try {
    // PASSIVE: copies what no reader still needs and never waits for, nor blocks, a writer or a
    // reader. The writer starts the WAL over from its beginning once all of it has been copied.
    db.pragma('wal_checkpoint(PASSIVE)');
    checkpoints++;
  } catch {
    // busy for longer than the timeout, or the file went away: the next tick tries again
  }
}, everyMs);

parentPort!.on('message', (m: { kind: 'close' } | { kind: 'stats' }) => {
  if (m.kind === 'stats') {
    parentPort!.postMessage({ kind: 'stats', checkpoints });
    return;
  }
  clearInterval(timer);
  db.close();
  parentPort!.close();
});
