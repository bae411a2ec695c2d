import type { SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import type { CreateLease, StateStore } from '../state-store.js';
import { TurnBatcher } from '../turn-batcher.js';

/** A single create's new row (written before its edge is asked). */
export interface NewRow {
  info: SandboxInfo;
  batch?: { id: string; index: number };
  spec: unknown;
  accessToken?: string;
}

type Write = { row: NewRow } | { running: string };
type Answer = true | SandboxStatus | null;

/**
 * The store writes of concurrent single creates, a few turns' worth at a time (turn-batcher.ts): the
 * rows of the creates that came in the turn and the settles (running) of those whose edges
 * answered go in one write, SandboxRecords.insertAndSettle: one round trip on PostgreSQL where a
 * turn with both made two. A replica with half the load forms groups half the size, and each group
 * cost its round trips whatever its size (issue 31: two replicas spent 1.47× one's CPU per create).
 * Should the one write fail, each part is written alone, so an insert that fails (its caller hears
 * why) does not fail the settles with it, nor they it.
 */
export class CreateWrites {
  readonly #batcher: TurnBatcher<Write, Answer>;

  constructor(store: Pick<StateStore, 'sandboxes'>, lease: () => CreateLease) {
    this.#batcher = new TurnBatcher((_, writes) => writeTurn(store, lease, writes), { turns: WRITE_TURNS });
  }

  // The batcher's own promises, not async wrappers around them: one promise less per write, and
  // a create makes two of these.

  /** Writes a create's row; resolves once it is in the store. */
  insert(row: NewRow): Promise<unknown> {
    return this.#batcher.add('', { row });
  }

  /** Marks a create running if its row is still `creating`: the row's status afterwards (null: gone). */
  running(id: string): Promise<SandboxStatus | null> {
    return this.#batcher.add('', { running: id }) as Promise<SandboxStatus | null>;
  }
}

/**
 * A write gathers three turns of the event loop's creates and settles, not one. A commit writes
 * back every page its turn changed, and those are mostly the same few (each index's last pages,
 * the counts' row): ~27 pages (WAL frames) for a turn of 14 creates and 14 settles, whatever the
 * turn's size, and the COMMIT was 7 % of the control plane's thread under load. Measured in
 * alternating `dsec bench cluster` runs (20,000 creates, 64 clients): 1 turn against 2 turns,
 * the control plane's CPU per create 189.5–221.5 against 167–204 µs; 2 against 3, 187.5–210.5
 * against 141–191 µs; 5 no better than 3. A lone create's p50 did not rise (the idle loop's turns
 * take microseconds).
 */
const WRITE_TURNS = 3;

async function writeTurn(store: Pick<StateStore, 'sandboxes'>, lease: () => CreateLease, writes: Write[]): Promise<(Answer | Error)[]> {
  const rows: NewRow[] = [];
  const settles: { id: string; status: SandboxStatus }[] = [];
  for (const w of writes) {
    if ('row' in w) rows.push(w.row);
    else settles.push({ id: w.running, status: 'running' });
  }
  let inserted: true | Error = true;
  let statuses: (SandboxStatus | null)[] | Error = [];
  if (rows.length === 0) statuses = await store.sandboxes.settleCreates(settles);
  else if (settles.length === 0) await store.sandboxes.insertMany(rows, lease());
  else {
    try {
      statuses = await store.sandboxes.insertAndSettle(rows, lease(), settles);
    } catch {
      // Neither part was written: each alone, so one part's failure is only its own callers'.
      const [ins, set] = await Promise.allSettled([store.sandboxes.insertMany(rows, lease()), store.sandboxes.settleCreates(settles)]);
      inserted = ins.status === 'fulfilled' ? true : asError(ins.reason);
      statuses = set.status === 'fulfilled' ? set.value : asError(set.reason);
    }
  }
  let next = 0;
  return writes.map((w) => {
    if ('row' in w) return inserted;
    return statuses instanceof Error ? statuses : (statuses[next++] ?? null);
  });
}

function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
