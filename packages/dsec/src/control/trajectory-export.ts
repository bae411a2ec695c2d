import type { TrajectoryLine } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { EndedSandboxes } from './ended-sandboxes.js';
import type { StateStore } from './state-store.js';
import type { TrajectoryLog } from './trajectory-log.js';
import { labelsMatch, type SqlValue } from './store/sql.js';

/** Which sandboxes a bulk read covers: every pair of `labels`, and the batch if one is named. */
export interface TrajectorySelector {
  labels: Record<string, string>;
  batch?: string;
  /** Only this project's sandboxes; undefined: every project's (an admin key that named none). */
  project?: string;
}

/** Sandboxes whose ids are read at once; their steps are then read a page at a time. */
const SANDBOX_PAGE = 256;
/** Steps read at once. */
const ENTRY_PAGE = 1000;

/**
 * The trajectories of many sandboxes as one stream of steps (GET /v1/trajectories, `dsec log
 * --label`): every sandbox the selector matches, live or killed with its log still kept, in id
 * order, each one's steps by seq. Both the sandboxes and their steps are read a page at a time
 * (a batch can be 32,000 sandboxes of hundreds of steps each), one statement per page: a cursor
 * held open while the client reads would hold a connection, and on SQLite make every write
 * meanwhile fail with "connection is busy".
 */
export class TrajectoryExport {
  constructor(
    private readonly deps: {
      store: Pick<StateStore, 'db'>;
      trajectory: TrajectoryLog;
      ended: EndedSandboxes;
      /** Page sizes (tests make them small to cross page boundaries). */
      pages?: { sandboxes: number; entries: number };
    },
  ) {}

  async *lines(sel: TrajectorySelector, now = Date.now()): AsyncGenerator<TrajectoryLine> {
    const pages = this.deps.pages ?? { sandboxes: SANDBOX_PAGE, entries: ENTRY_PAGE };
    for (let afterId = ''; ;) {
      const ids = await this.sandboxIds(sel, afterId, pages.sandboxes, now);
      if (ids.length === 0) return;
      for (let at = { sandboxId: '', seq: 0 }; ;) {
        const page = await this.deps.trajectory.page(ids, at, pages.entries);
        yield* page;
        if (page.length < pages.entries) break;
        const last = page.at(-1)!;
        at = { sandboxId: last.sandboxId, seq: last.seq };
      }
      afterId = ids.at(-1)!;
    }
  }

  /**
   * The next `limit` ids after `afterId` of the sandboxes the selector matches: live rows (any
   * status) and tombstones still within the retention time. An id is in one table or the other
   * (a kill moves it in one transaction); UNION also drops a duplicate should one appear.
   */
  async sandboxIds(sel: TrajectorySelector, afterId: string, limit: number, now = Date.now()): Promise<string[]> {
    const db = this.deps.store.db;
    const part = (table: 'sandboxes' | 'ended_sandboxes'): { sql: string; params: SqlValue[] } => {
      const { where, params } = labelsMatch(db.dialect, `${table}.labels`, sel.labels);
      where.unshift('id > ?');
      params.unshift(afterId);
      if (sel.batch !== undefined) {
        where.push('batch_id = ?');
        params.push(sel.batch);
      }
      if (sel.project !== undefined) {
        // A tombstone from before projects has none: it is the default project's.
        if (table === 'sandboxes') where.push('project = ?');
        else {
          where.push('coalesce(project, ?) = ?');
          params.push(DEFAULT_PROJECT);
        }
        params.push(sel.project);
      }
      if (table === 'ended_sandboxes') {
        where.push('ended_at > ?');
        params.push(now - this.deps.ended.retentionMs);
      }
      return { sql: `SELECT id FROM ${table} WHERE ${where.join(' AND ')}`, params };
    };
    const live = part('sandboxes');
    const killed = part('ended_sandboxes');
    // Each side walks its primary key from afterId and stops at `limit` matches, so a whole export
    // reads each table once (a plain UNION … ORDER BY … LIMIT built and sorted every match on
    // every page: quadratic in a 32,000-sandbox batch).
    const rows = await db.all<{ id: string }>(
      `SELECT id FROM (${live.sql} ORDER BY id LIMIT ?) AS live UNION SELECT id FROM (${killed.sql} ORDER BY id LIMIT ?) AS killed ORDER BY id LIMIT ?`,
      [...live.params, limit, ...killed.params, limit, limit],
    );
    return rows.map((r) => r.id);
  }
}
