import { once } from 'node:events';
import { Worker } from 'node:worker_threads';

export interface CheckpointerData {
  file: string;
  /** How often the WAL's size is looked at. */
  everyMs: number;
  /** A checkpoint runs once the WAL is at least this large. */
  minWalBytes: number;
}

/**
 * Checkpoints of a SQLite database in WAL mode, on a thread of their own. SQLite's default
 * (wal_autocheckpoint) checkpoints inside the commit that takes the WAL past 1,000 pages: the
 * committing call copies the WAL into the database file and fsyncs it, synchronously, so with
 * better-sqlite3 the control plane's event loop stood still for it: the store's writes for a
 * batch of 32,000 sandboxes (rows, specs, labels, statuses, events, in groups of 64) took 4.0 and
 * 4.6 s with those checkpoints and 2.4 and 2.6 s without, for the same CPU time (1.7–1.9 s): the
 * difference was the loop waiting on the checkpoints' writes and fsyncs. Here a worker thread with its own
 * connection runs PASSIVE checkpoints (they neither block nor wait for the writer) whenever the
 * WAL has grown past CHECKPOINT_AT_BYTES; the main connection keeps an autocheckpoint far above
 * that as a backstop should this thread fall behind. Durability is as before: commits go to the
 * WAL (synchronous=NORMAL), and a crash mid-checkpoint is recovered from the WAL at the next open.
 */
export class SqliteCheckpointer {
  #exited = false;

  private constructor(private readonly worker: Worker) {
    worker.once('exit', () => (this.#exited = true));
  }

  static start(file: string, opts: Partial<Omit<CheckpointerData, 'file'>> = {}): SqliteCheckpointer {
    const data: CheckpointerData = { file, everyMs: opts.everyMs ?? 250, minWalBytes: opts.minWalBytes ?? CHECKPOINT_AT_BYTES };
    const worker = new Worker(new URL('./sqlite-checkpoint-worker.js', import.meta.url), { workerData: data });
    // A thread that fails (the file cannot be opened) leaves the main connection's backstop.
    worker.on('error', () => {});
    worker.unref();
    return new SqliteCheckpointer(worker);
  }

  /** Checkpoints run so far (tests). */
  async checkpoints(): Promise<number> {
    if (this.#exited) throw new Error('the checkpoint thread has exited');
    this.worker.ref();
    try {
      this.worker.postMessage({ kind: 'stats' });
      const [m] = (await once(this.worker, 'message')) as [{ checkpoints: number }];
      return m.checkpoints;
    } finally {
      this.worker.unref();
    }
  }

  async close(): Promise<void> {
    if (this.#exited) return;
    this.worker.ref();
    const exited = once(this.worker, 'exit');
    this.worker.postMessage({ kind: 'close' });
    await exited;
  }
}

/** The WAL size at which the thread checkpoints: SQLite's own default point (1,000 pages of 4 KiB). */
export const CHECKPOINT_AT_BYTES = 1000 * 4096;
/** The main connection's own autocheckpoint, in pages: only if the thread has fallen far behind (64 MiB of WAL). */
export const BACKSTOP_PAGES = 16384;
