import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { BatchEvent, BatchInfo, CreateBatchRequest } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { ProjectQuotas } from '../project-quotas.js';
import { SYSTEM } from './callers.js';
import type { SandboxService } from './sandboxes.js';
import type { StateStore, StoredBatch } from '../state-store.js';
import { BATCH_CONCURRENCY_PER_EDGE, DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { LiveBatch, type Emitted } from './live-batch.js';
import { BATCH_LABEL } from './reserved-labels.js';

/** Items created in one group: one transaction for their rows, one request per edge. */
const MAX_GROUP = 256;

/** Events are written to the store in groups: one transaction per group, not per event. */
const FLUSH_EVERY_MS = 50;
/** A timed flush that failed is tried again after twice the last wait, up to this. */
const FLUSH_RETRY_MAX_MS = 5000;
/**
 * A batch is driven by one control-plane replica, its owner, which renews its lease on it every
 * second; a running batch whose lease ran out (its owner died) is taken over by another replica.
 */
const BATCH_LEASE_MS = 10_000;
/** How often a replica that does not drive a batch reads its new events from the store. */
const FOLLOW_POLL_MS = 250;

/**
 * Batches: N sandboxes of one spec as one job (up to 32,000). The driver creates them through the
 * control plane's own create (placement, admission retries, the state store), with a bounded
 * number in flight, and records each step as an event: accepted, placed, running or failed with a
 * reason, then done. Events carry a sequence number and are kept in the store, so a client that
 * reconnects resumes after the last one it saw, and a restarted control plane finishes a batch it
 * was driving: items that already have a sandbox row are not created again (the store's unique
 * (batch, index) says so), the rest are.
 *
 * One file for one concept, a batch's life as a job: accepting it, driving it, its ownership
 * among replicas, its streams and its writes to the store all act on the same live batches and
 * their leases. A live batch's own state and event log are in live-batch.ts.
 */
export class BatchService {
  readonly #live = new Map<string, LiveBatch>();
  readonly #drivers = new Set<Promise<void>>();
  #flushTimer: NodeJS.Timeout | undefined;
  /** The wait before the next timed flush: FLUSH_EVERY_MS, longer after failed ones (#flushSoon). */
  #flushDelay = FLUSH_EVERY_MS;
  /** The last flush started (flush()). */
  #flushing: Promise<void> = Promise.resolve();
  #stopped = false;
  readonly #edgeLists = new Map<string, { at: number; ids: Promise<Set<string>> }>();

  constructor(
    private readonly store: StateStore,
    private readonly sandboxes: SandboxService,
    private readonly quotas: ProjectQuotas,
    /** Read only to settle a create a restart interrupted: did its edge make the sandbox? */
    private readonly edges: EdgeRegistry,
    private readonly log: Logger,
    /** This replica's name in the batches' owner column. */
    private readonly replicaId = 'only',
  ) {}

  /**
   * Accepts a batch for `project`: the spec is checked first (a bad spec is a 400, not 32,000
   * failures), and so is the project's quota for a count that could never fit it (a 403); items
   * that do not fit when their turn comes fail with the quota's code, and the project's create
   * rate paces the batch.
   */
  async create(req: CreateBatchRequest, project: string = DEFAULT_PROJECT): Promise<BatchInfo> {
    await this.sandboxes.checkSpec(req.spec, project);
    await this.quotas.precheck(project, this.sandboxes.limitsFor(req.spec), req.count, false);
    const id = `batch-${randomBytes(8).toString('hex')}`;
    const createdAt = new Date().toISOString();
    // Resolved now and kept with the request: a batch resumed after a restart keeps it.
    const concurrency = await this.#concurrency(req, project);
    await this.store.batches.insert(id, req.count, { ...req, concurrency }, createdAt, project, {
      id: this.replicaId,
      until: Date.now() + BATCH_LEASE_MS,
    });
    const b = new LiveBatch(id, req.count, req.spec, createdAt, project, concurrency);
    this.#live.set(id, b);
    this.#emit(b, { type: 'accepted', count: req.count });
    this.#start(b);
    return this.info(id);
  }

  /**
   * Creates in flight: the request's, else BATCH_CONCURRENCY_PER_EDGE per ready edge of the spec's
   * pool (at least one edge's worth, at most 1024). Either way a project with a create rate gets no
   * more than that rate's second of creates, or BATCH_CONCURRENCY_PER_EDGE if that is more: each
   * create is placed, and holds its edge's room, while it waits for its token, so more in flight
   * would not go faster, only keep that room from every other create.
   */
  async #concurrency(req: CreateBatchRequest, project: string): Promise<number> {
    let n = req.concurrency;
    if (n === undefined) {
      const pool = req.spec.placement?.pool ?? 'default';
      const edges = this.edges.candidates().filter((c) => c.state === 'ready' && c.pool === pool).length;
      n = Math.min(1024, BATCH_CONCURRENCY_PER_EDGE * Math.max(1, edges));
    }
    const rate = (await this.quotas.quotaOf(project)).createsPerSecond;
    if (rate !== undefined) n = Math.min(n, Math.max(BATCH_CONCURRENCY_PER_EDGE, Math.ceil(rate)));
    return n;
  }

  /** Batches this process drives that have not finished, with their counts so far (for /metrics). */
  progress(): { id: string; count: number; placed: number; running: number; failed: number }[] {
    return [...this.#live.values()]
      .filter((b) => !b.finished)
      .map((b) => ({ id: b.id, count: b.count, placed: b.placed, running: b.running, failed: b.failed }));
  }

  /**
   * After a restart: picks up every batch that was still running. On SQLite (one control plane)
   * that is every running batch; on a shared store, those whose owner's lease ran out.
   */
  async resume(): Promise<void> {
    const now = Date.now();
    await this.#adopt(await this.store.batches.claim(this.replicaId, now + BATCH_LEASE_MS, now, this.store.db.dialect === 'sqlite'));
  }

  /**
   * Every `intervalMs`: renews the leases of the batches this replica drives (cancelling those
   * another replica was asked to cancel), and takes over running batches nobody renews.
   */
  startOwnerLoop(intervalMs = 1000): () => void {
    let busy = false;
    const timer = setInterval(() => {
      if (busy || this.#stopped) return;
      busy = true;
      void this.#ownerTick()
        .catch((err: unknown) => this.log.error({ err }, 'batch lease renewal failed'))
        .finally(() => (busy = false));
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }

  async #ownerTick(): Promise<void> {
    const now = Date.now();
    const mine = [...this.#live.values()].filter((b) => !b.finished).map((b) => b.id);
    const { cancel, lost } = await this.store.batches.renew(mine, this.replicaId, now + BATCH_LEASE_MS);
    for (const id of lost) this.#handOver(id);
    for (const id of cancel) await this.cancel(id);
    await this.#adopt((await this.store.batches.claim(this.replicaId, now + BATCH_LEASE_MS, now)).filter((r) => !this.#live.has(r.id)));
  }

  async #adopt(rows: StoredBatch[]): Promise<void> {
    for (const row of rows) {
      const req = JSON.parse(row.spec) as CreateBatchRequest;
      const b = new LiveBatch(row.id, row.count, req.spec, row.createdAt, row.project, storedConcurrency(req));
      for (const e of await this.store.batches.events(row.id, -1)) b.load(e);
      this.#live.set(row.id, b);
      this.log.warn(
        { batch: row.id, done: b.done.size, count: row.count, replica: this.replicaId },
        'resuming a batch its driver left (a restart, or a replica that died)',
      );
      this.#start(b);
    }
  }

  async info(id: string): Promise<BatchInfo> {
    const b = this.#live.get(id);
    if (b) {
      const info: BatchInfo = {
        id,
        count: b.count,
        state: b.cancelled ? 'cancelled' : b.finished ? 'done' : 'running',
        placed: b.placed,
        running: b.running,
        failed: b.failed,
        createdAt: b.createdAt,
        lastSeq: b.events.length - 1,
        concurrency: b.concurrency,
      };
      return info;
    }
    const row = await this.store.batches.get(id);
    if (!row) throw new ApiError('BATCH_NOT_FOUND', `no batch ${id}`, { id });
    // From the counts on its row, kept as its events are written: never a recount of its events.
    const info: BatchInfo = {
      id,
      count: row.count,
      state: row.state,
      placed: row.placed,
      running: row.running,
      failed: row.failed,
      createdAt: row.createdAt,
      lastSeq: row.lastSeq,
      concurrency: storedConcurrency(JSON.parse(row.spec) as CreateBatchRequest),
    };
    if (row.finishedAt) info.finishedAt = row.finishedAt;
    return info;
  }

  /** The newest `limit` batches (of one project, or of all when `project` is undefined), newest first, each with its counts. */
  async list(limit: number, project?: string): Promise<BatchInfo[]> {
    const rows = (await this.store.batches.list()).filter((b) => project === undefined || b.project === project);
    const newest = rows.slice(-limit).reverse();
    const out: BatchInfo[] = [];
    for (const row of newest) out.push(await this.info(row.id));
    return out;
  }

  /**
   * Events after `after`, then (with follow) live ones until the batch ends. Served from memory
   * while this process drives the batch, from the store otherwise.
   */
  async *events(id: string, after: number, follow: boolean, signal?: AbortSignal): AsyncGenerator<BatchEvent> {
    for await (const chunk of this.eventChunks(id, after, follow, signal)) yield* chunk;
  }

  /**
   * events(), as the runs of events there are at each look: a stream writes each run in one piece
   * (a batch of 32,000 makes ~64,000 events, and one socket write per event was a tenth of the
   * control plane's time placing it).
   */
  async *eventChunks(id: string, after: number, follow: boolean, signal?: AbortSignal): AsyncGenerator<BatchEvent[]> {
    for await (const run of this.#runs(id, after, follow, signal)) yield run.events;
  }

  /** eventChunks() as NDJSON text, one line per event, from the JSON each event was given at its emit. */
  async *eventText(id: string, after: number, follow: boolean, signal?: AbortSignal): AsyncGenerator<string> {
    for await (const run of this.#runs(id, after, follow, signal)) {
      let text = '';
      if (run.texts) for (const t of run.texts) text += `${t}\n`;
      else for (const e of run.events) text += `${JSON.stringify(e)}\n`;
      yield text;
    }
  }

  /** The runs of eventChunks(), with their JSON texts while this process drives the batch. */
  async *#runs(
    id: string,
    after: number,
    follow: boolean,
    signal?: AbortSignal,
  ): AsyncGenerator<{ events: BatchEvent[]; texts?: string[] }> {
    const b = this.#live.get(id);
    if (!b) {
      // Driven by another replica (or finished): its events as they reach the store.
      let last = (await this.info(id)).state; // 404 for an unknown batch
      for (;;) {
        const stored = await this.store.batches.events(id, after);
        if (stored.length) {
          yield { events: stored };
          after = stored[stored.length - 1]!.seq;
        }
        if (!follow || last !== 'running' || signal?.aborted) return;
        await sleep(FOLLOW_POLL_MS, signal);
        if (this.#live.has(id)) return yield* this.#runs(id, after, follow, signal); // taken over here meanwhile
        last = (await this.store.batches.get(id))?.state ?? 'done';
      }
    }
    let next = after + 1;
    for (;;) {
      if (next < b.events.length) {
        const run = b.runFrom(next);
        next += run.events.length;
        yield run;
        continue; // more may have come while the consumer wrote this run
      }
      if (!follow || b.finished || signal?.aborted) return;
      await b.nextEvent(signal);
    }
  }

  /** Stops creating and kills what the batch made. */
  async cancel(id: string): Promise<BatchInfo> {
    const b = this.#live.get(id);
    if (!b) {
      let info = await this.info(id);
      if (info.state !== 'running') return info;
      // Its owner (another replica) cancels it at its next lease renewal, or whoever takes it over.
      await this.store.batches.requestCancel(id);
      for (let waited = 0; info.state === 'running' && waited < 30_000 && !this.#live.has(id); waited += FOLLOW_POLL_MS) {
        await sleep(FOLLOW_POLL_MS);
        info = await this.info(id);
      }
      return this.#live.has(id) ? this.cancel(id) : info;
    }
    if (!b.finished) {
      b.cancelled = true;
      // The groups in flight finish first: a row they write after the kill would outlive it.
      await b.driver;
      await this.sandboxes.killByLabels(SYSTEM, { [BATCH_LABEL]: id });
      await this.#finish(b, 'cancelled');
    }
    return this.info(id);
  }

  #start(b: LiveBatch): void {
    const p = this.#drive(b).catch((err: unknown) => this.log.error({ err, batch: b.id }, 'batch driver failed'));
    b.driver = p;
    this.#drivers.add(p);
    void p.finally(() => {
      this.#drivers.delete(p);
      // Handed over: the new owner has it; this replica may adopt it again should that one stall.
      if (b.handedOver && this.#live.get(b.id) === b) this.#live.delete(b.id);
    });
  }

  /** Another replica owns batch `id` now: stop driving it here (the groups in flight finish). */
  #handOver(id: string): void {
    const b = this.#live.get(id);
    if (!b || b.handedOver || b.finished) return;
    b.handedOver = true;
    b.dropUnflushed();
    this.log.warn(
      { batch: id, replica: this.replicaId },
      'another replica took this batch over (its lease here ran out); stopping driving it',
    );
  }

  async #drive(b: LiveBatch): Promise<void> {
    // Items a previous run got to are settled from their sandbox rows; the rest are created in
    // groups (rows in one transaction, one request per edge: see SandboxService.createGroup).
    const rows = new Map((await this.store.batches.sandboxes(b.id)).map((r) => [r.index, r]));
    const todo: number[] = [];
    const settling: Promise<void>[] = [];
    for (let index = 0; index < b.count; index++) {
      if (b.done.has(index)) continue;
      const row = rows.get(index);
      if (row) settling.push(this.#settleExisting(b, index, row.id));
      else todo.push(index);
    }
    // As few lanes as keep each group within MAX_GROUP, the concurrency split evenly among them:
    // lanes of MAX_GROUP each would put up to one group too many in flight (320 as 2 × 256).
    const lanes = Math.max(1, Math.ceil(b.concurrency / MAX_GROUP));
    const size = Math.ceil(b.concurrency / lanes);
    let next = 0;
    const lane = async (): Promise<void> => {
      while (!b.cancelled && !this.#stopped && !b.handedOver && next < todo.length) {
        const group = todo.slice(next, (next += size));
        try {
          await this.sandboxes.createGroup(b.spec, { [BATCH_LABEL]: b.id }, group, {
            batchId: b.id,
            project: b.project,
            onPlaced: (index, edge, sandboxId) => this.#emit(b, { type: 'placed', index, edge, sandboxId }),
            onRunning: (index, edge, sandboxId) => this.#emit(b, { type: 'running', index, sandboxId, edge }),
            onFailed: (index, code, reason, sandboxId) =>
              this.#emit(b, { type: 'failed', index, code, reason, ...(sandboxId ? { sandboxId } : {}) }),
          });
        } catch (err) {
          // The spec stopped resolving (an image deleted since the batch was accepted): every
          // item of the group still open fails with the reason.
          const e = err instanceof ApiError ? err : new ApiError('SANDBOX_CREATE_FAILED', (err as Error).message);
          for (const index of group) if (!b.done.has(index)) this.#emit(b, { type: 'failed', index, code: e.code, reason: e.message });
        }
      }
    };
    await Promise.all([...settling, ...Array.from({ length: lanes }, lane)]);
    if (!b.cancelled && !this.#stopped && !b.handedOver) await this.#finish(b, 'done');
  }

  /** An item whose sandbox a previous run created: running, failed, or still being reconciled. */
  async #settleExisting(b: LiveBatch, index: number, sandboxId: string): Promise<void> {
    let leased: boolean | undefined;
    for (let waited = 0; ; waited += 500) {
      if (b.cancelled || b.handedOver) return; // its row goes with the cancel's kill; or the new owner settles it
      const s = await this.store.sandboxes.get(sandboxId);
      if (!s)
        return this.#emit(b, {
          type: 'failed',
          index,
          sandboxId,
          code: 'SANDBOX_NOT_FOUND',
          reason: 'the sandbox was killed before the batch finished',
        });
      if (s.status === 'running' || s.status === 'paused') return this.#emit(b, { type: 'running', index, sandboxId, edge: s.edge });
      if (s.status !== 'creating')
        return this.#emit(b, {
          type: 'failed',
          index,
          sandboxId,
          edge: s.edge,
          code: 'SANDBOX_CREATE_FAILED',
          reason: s.reason ?? s.status,
        });
      // 'creating' across a restart or a dead replica's create. A row with a create lease is
      // settled by the replica that takes abandoned creates over (create-leases.ts) once the lease
      // runs out; only rows written before create leases existed are settled here.
      if ((leased ??= (await this.store.sandboxes.createOwner(sandboxId)) !== undefined)) {
        if (this.#stopped) return; // the batch stays running in the store: the next start resumes it
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      if (waited >= 1000 && (await this.#edgeRuns(s.edge, sandboxId))) {
        await this.store.sandboxes.setStatus(sandboxId, 'running');
        return this.#emit(b, { type: 'running', index, sandboxId, edge: s.edge });
      }
      if (waited >= 30_000 || this.#stopped) {
        // Not on its edge: never made, or made after the last look; a kill makes sure it is not.
        await this.edges
          .api(s.edge)
          .killSandbox(sandboxId)
          .catch(() => undefined);
        await this.store.sandboxes.setStatus(
          sandboxId,
          'failed',
          'lost: the control plane restarted while creating it and its edge never reported it',
        );
        return this.#emit(b, {
          type: 'failed',
          index,
          sandboxId,
          edge: s.edge,
          code: 'SANDBOX_CREATE_FAILED',
          reason: 'lost while the control plane restarted',
        });
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  /** Whether an edge runs a sandbox (its list, read at most once a second per edge). */
  async #edgeRuns(edgeId: string, sandboxId: string): Promise<boolean> {
    let seen = this.#edgeLists.get(edgeId);
    if (!seen || Date.now() - seen.at > 1000) {
      const ids = this.edges
        .api(edgeId)
        .listSandboxes()
        .then((l) => new Set(l.map((x) => x.id)))
        .catch(() => new Set<string>());
      this.#edgeLists.set(edgeId, (seen = { at: Date.now(), ids }));
    }
    return (await seen.ids).has(sandboxId);
  }

  #emit(b: LiveBatch, e: Emitted): void {
    if (b.handedOver) return; // the new owner reports it
    b.record(e);
    this.#flushSoon();
  }

  /**
   * A flush in FLUSH_EVERY_MS, unless one is due already. One that fails is tried again as long as
   * there is more to write, after twice the last wait (up to FLUSH_RETRY_MAX_MS): a store that is
   * away was asked, and its failure logged, 20 times a second. A flush that succeeds (timed or
   * not) brings the wait back to FLUSH_EVERY_MS.
   */
  #flushSoon(): void {
    if (this.#stopped) return;
    this.#flushTimer ??= setTimeout(
      () =>
        void this.flush().catch((err: unknown) => {
          this.#flushDelay = Math.min(this.#flushDelay * 2, FLUSH_RETRY_MAX_MS);
          this.log.error({ err, retryInMs: this.#flushDelay }, 'writing batch events failed; trying again');
          if ([...this.#live.values()].some((b) => b.hasUnflushed)) this.#flushSoon();
        }),
      this.#flushDelay,
    );
  }

  async #finish(b: LiveBatch, how: 'done' | 'cancelled'): Promise<void> {
    this.#emit(b, { type: how });
    // Until the store has it: a batch that is done here but running in the store would be driven
    // again at the next start, and its stream would lack what the store missed.
    await this.#untilWritten(`finishing batch ${b.id}`, async () => {
      await this.flush();
      await this.store.batches.finish(b.id, how, new Date().toISOString());
    });
    // Its status and events are in the store now (counts on its row): a finished batch's ~2 events
    // per sandbox do not stay in memory (400,000 sandboxes made by batches would be 800,000 events).
    // Streams already following it keep their reference and end with its last event.
    this.#live.delete(b.id);
  }

  /** `write`, again with backoff (50 ms to 5 s) while it fails, until it succeeds or this process stops. */
  async #untilWritten(what: string, write: () => Promise<void>): Promise<void> {
    for (let delay = FLUSH_EVERY_MS; ; delay = Math.min(delay * 2, FLUSH_RETRY_MAX_MS)) {
      try {
        return await write();
      } catch (err) {
        if (this.#stopped) throw err;
        this.log.warn({ err }, `${what} failed; trying again`);
        await sleep(delay);
      }
    }
  }

  /**
   * Writes buffered events, one transaction for all batches. Flushes run one after another: the
   * store keeps a batch's events only above the last seq it has (store/batches.ts), so a later
   * run committed first would drop an earlier one.
   */
  flush(): Promise<void> {
    const run = this.#flushing.then(() => this.#flushNow());
    this.#flushing = run.catch(() => undefined);
    return run;
  }

  async #flushNow(): Promise<void> {
    if (this.#flushTimer) clearTimeout(this.#flushTimer);
    this.#flushTimer = undefined;
    const taken = [...this.#live.values()].flatMap((b) => {
      const t = b.takeUnflushed();
      return t ? [{ b, t }] : [];
    });
    // Nothing to write (a hand-over dropped what a failed flush kept): nothing is failing either.
    if (!taken.length) {
      this.#flushDelay = FLUSH_EVERY_MS;
      return;
    }
    let lost: string[];
    try {
      lost = await this.store.batches.appendEvents(
        taken.map(({ b, t }) => ({ id: b.id, events: t.events, texts: t.texts })),
        this.replicaId,
      );
      this.#flushDelay = FLUSH_EVERY_MS;
    } catch (err) {
      // Kept for the next flush, ahead of any since: the store keeps only events above a batch's
      // last seq, so one written after them would drop them, and a retry writes each once.
      for (const { b, t } of taken) b.putBack(t.at);
      throw err;
    }
    // A batch another replica took over since the last renewal gets none of them (store/batches.ts).
    for (const id of lost) this.#handOver(id);
  }

  /**
   * Stops driving: creates in flight finish, no new ones start, and the batch stays `running` in
   * the store, so the next start resumes it.
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    await Promise.allSettled([...this.#drivers]);
    await this.flush();
  }
}

/** The concurrency kept with a stored batch's request; batches accepted before it was kept ran with 64. */
function storedConcurrency(req: CreateBatchRequest): number {
  return req.concurrency ?? BATCH_CONCURRENCY_PER_EDGE;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}
