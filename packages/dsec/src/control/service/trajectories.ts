import type { Trajectory, TrajectoryEntry, TrajectoryLine } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EndedSandboxes } from '../ended-sandboxes.js';
import type { StateStore } from '../state-store.js';
import type { TrajectoryExport } from '../trajectory-export.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { sees, type Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import { holdAnswer, type Hold, type OutputBudget } from '../../output-budget.js';

/** The sandbox a fork was made from (set by SnapshotService.fork). */
export const FORK_OF_LABEL = 'dsec.fork-of';
/**
 * The seq of the parent's last logged step when the fork's snapshot was taken: the fork's own
 * steps continue from there. A label rather than a column: it travels with `dsec.fork-of` in every
 * place labels already go (the sandbox's info, `dsec ps`, a killed sandbox's tombstone), so a
 * lineage can be walked through killed ancestors with no further schema.
 */
export const FORK_AT_SEQ_LABEL = 'dsec.fork-at-seq';

/** One ancestor in a lineage: its steps up to `upTo` come before its child's. */
export interface Ancestor {
  id: string;
  upTo: number;
}

/**
 * Reading trajectories as a caller: one sandbox's (optionally with its fork lineage), and many
 * sandboxes' at once by label or batch (a trainer's whole run). Project scope as everywhere: a
 * project key reads its own project's only, and another project's sandbox or batch answers as one
 * that does not exist.
 */
export class TrajectoryService {
  constructor(
    private readonly deps: {
      store: Pick<StateStore, 'sandboxes' | 'batches'>;
      lookup: SandboxLookup;
      trajectory: TrajectoryLog;
      ended: EndedSandboxes;
      export: TrajectoryExport;
      outputBudget: OutputBudget;
    },
  ) {}

  /**
   * A sandbox's steps (also of one killed within the retention time). With `lineage`, a fork's
   * steps come after its ancestors', each ancestor's up to its fork point, oldest first, every
   * entry carrying the sandbox it ran in; `afterSeq` and `limit` page the sandbox's own steps, and
   * the ancestors' come on the first page (afterSeq 0) only.
   */
  async read(
    caller: Caller,
    id: string,
    q: { afterSeq?: number; limit?: number; lineage?: boolean } = {},
    hold?: Hold,
  ): Promise<Trajectory> {
    await this.#assertReadable(caller, id);
    const afterSeq = q.afterSeq ?? 0;
    const own = await this.deps.trajectory.list(id, afterSeq, q.limit ?? 1000);
    if (!q.lineage) return this.#held(caller, { sandboxId: id, ...own }, hold);
    const { ancestors, missing } = await this.lineage(caller, id);
    const entries: TrajectoryEntry[] = [];
    if (afterSeq === 0)
      for (const a of ancestors) for (const e of await this.deps.trajectory.upTo(a.id, a.upTo)) entries.push({ ...e, sandboxId: a.id });
    for (const e of own.entries) entries.push({ ...e, sandboxId: id });
    return this.#held(caller, { sandboxId: id, entries, dropped: own.dropped, lineageMissing: missing }, hold);
  }

  /**
   * A page is answered as one JSON body: each step's output (64 KiB a stream, 6 times that as JSON
   * for control bytes) and its request make 10,000 steps several GiB. What it holds past the free 2 MiB is held
   * from the output budget until it is sent (holdAnswer).
   */
  #held(caller: Caller, page: Trajectory, hold: Hold | undefined): Trajectory {
    // Each entry as it will be sent: a request is kept whole (a session command of 128 KiB, an
    // exec's argv), a result's output up to 64 KiB a stream, escapes and all.
    let bytes = 0;
    for (const e of page.entries) bytes += Buffer.byteLength(JSON.stringify(e)) + 1;
    holdAnswer(
      this.deps.outputBudget,
      caller.project,
      bytes,
      `this page of ${page.entries.length} steps`,
      hold,
      'ask for fewer steps a page (limit), read the pages already sent for',
    );
    return page;
  }

  /**
   * The ancestors of `id`, oldest first, by its `dsec.fork-of` and `dsec.fork-at-seq` labels and
   * theirs. The walk stops at a sandbox that is no fork, and at a parent it cannot read (its log
   * is no longer kept, it is not the caller's, or the fork has no fork point: made before fork
   * points were recorded), which it names in `missing` rather than leaving out unsaid. Labels a
   * create set by hand can name any id: an ancestor is read only as the caller could read it by
   * id, and a cycle ends the walk.
   */
  async lineage(caller: Caller, id: string): Promise<{ ancestors: Ancestor[]; missing: string[] }> {
    const ancestors: Ancestor[] = [];
    const seen = new Set([id]);
    let labels = await this.#labelsIfReadable(caller, id);
    for (;;) {
      const parent = labels?.[FORK_OF_LABEL];
      if (parent === undefined || seen.has(parent)) return { ancestors, missing: [] };
      seen.add(parent);
      const at = labels?.[FORK_AT_SEQ_LABEL];
      const parentLabels = await this.#labelsIfReadable(caller, parent);
      if (at === undefined || !/^\d{1,9}$/.test(at) || parentLabels === undefined) return { ancestors, missing: [parent] };
      ancestors.unshift({ id: parent, upTo: Number(at) });
      labels = parentLabels;
    }
  }

  /**
   * The steps of every sandbox whose labels hold all of `labels` and that belongs to `batch` (at
   * least one of the two), live or killed with its log still kept, in sandbox id order, each one's
   * by seq: see TrajectoryExport. Checked before the first line: a bad request or another
   * project's batch is an error answer, not a broken stream.
   */
  async stream(
    caller: Caller,
    q: { labels: Record<string, string>; batch?: string; project?: string },
  ): Promise<AsyncGenerator<TrajectoryLine>> {
    if (Object.keys(q.labels).length === 0 && q.batch === undefined)
      throw new ApiError(
        'INVALID_REQUEST',
        'name the sandboxes whose trajectories to read: label=KEY=VALUE (repeatable, all must match) and/or batch=BATCH_ID; one sandbox: GET /v1/sandboxes/{id}/trajectory',
        { field: 'label' },
      );
    if (q.batch !== undefined) {
      const batch = await this.deps.store.batches.get(q.batch);
      if (!batch || !sees(caller, batch.project)) throw new ApiError('BATCH_NOT_FOUND', `no batch ${q.batch}`, { id: q.batch });
    }
    const project = caller.admin ? q.project : caller.project;
    return this.deps.export.lines({
      labels: q.labels,
      ...(q.batch !== undefined ? { batch: q.batch } : {}),
      ...(project !== undefined ? { project } : {}),
    });
  }

  /** SANDBOX_NOT_FOUND unless `id` is a sandbox the caller sees, or a killed one of its project whose log is kept. */
  async #assertReadable(caller: Caller, id: string): Promise<void> {
    if (!(await this.deps.lookup.trajectoryKept(caller, id))) await this.deps.lookup.get(caller, id);
  }

  /**
   * The labels of a sandbox whose log the caller may read (live, or killed and kept); undefined
   * when it may not. A tombstone from before labels were kept answers {}: its own steps are
   * there, its parent is unknown.
   */
  async #labelsIfReadable(caller: Caller, id: string): Promise<Record<string, string> | undefined> {
    const s = await this.deps.store.sandboxes.get(id);
    if (s) return sees(caller, s.project) ? s.labels : undefined;
    const ended = await this.deps.ended.record(id);
    return ended && sees(caller, ended.project) ? (ended.labels ?? {}) : undefined;
  }
}
