import type { Logger } from 'pino';
import type { FnRunResult } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import type { EdgeFnRequest } from '../../protocol/edge-api.js';
import type { Backend } from '../backend.js';
import type { ContainerBackend } from '../container/container-backend.js';
import { FnWorker, isWorkerId } from './fn-worker.js';

export interface FnCallsOptions {
  /** Workers of one kind (image, memory, disk, network) at most; calls beyond wait for one. @default 32 */
  maxWorkersPerKind?: number;
  /** Workers on the node at most, all kinds together. @default 64 */
  maxWorkers?: number;
  /** An idle worker is killed after this long. @default 300000 */
  idleMs?: number;
  log: Logger;
}

/** Worker starts at once per node (see #startSlot). */
const STARTS_AT_ONCE = 4;

interface Waiter {
  resolve: (w: FnWorker | undefined) => void;
}

/**
 * The FnCall backend: warm worker sandboxes per kind (project, image, memoryMiB, diskMiB, network), each
 * running a fork server, one call at a time per worker. A call takes an idle worker of its kind,
 * or starts one (a cold start) while the kind and the node have room, or waits for one. A worker
 * a call damaged is killed and the next call gets a fresh one. Workers are edge-internal sandboxes
 * (ids `sb-<edge>-fn…`): the dispatch leaves them out of listings, and an edge start kills any an
 * earlier run left (a worker holds nothing worth keeping).
 */
export class FnCalls implements Backend {
  readonly #idle = new Map<string, FnWorker[]>();
  readonly #count = new Map<string, number>();
  readonly #waiting = new Map<string, Waiter[]>();
  #total = 0;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  /** Workers being killed: shutdown waits for them, so a node that stops leaves none half torn down. */
  readonly #retiring = new Set<Promise<void>>();
  readonly #maxPerKind: number;
  readonly #max: number;
  readonly #idleMs: number;
  /** Worker starts in flight and those waiting for a slot: a burst of cold calls starts workers a few at a time. */
  #starting = 0;
  readonly #startQueue: (() => void)[] = [];
  /** Calls served, cold starts, workers replaced after a damaging call: for info and benchmarks. */
  readonly stats = { calls: 0, coldStarts: 0, replaced: 0 };

  constructor(
    private readonly edge: ContainerBackend,
    private readonly opts: FnCallsOptions,
  ) {
    this.#maxPerKind = opts.maxWorkersPerKind ?? 32;
    this.#max = opts.maxWorkers ?? 64;
    this.#idleMs = opts.idleMs ?? 300_000;
  }

  /** Kills workers an earlier run of this edge left (adopted by the Edge's start as sandboxes). */
  async start(): Promise<void> {
    const left = (await this.edge.listSandboxes()).filter((s) => isWorkerId(s.id));
    await Promise.allSettled(left.map((s) => this.edge.killSandbox(s.id)));
    if (left.length) this.opts.log.info({ workers: left.length }, 'killed fn workers an earlier run left');
    this.#timer = setInterval(() => void this.#reapIdle(), Math.min(this.#idleMs, 10_000));
    this.#timer.unref();
  }

  async shutdown(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    for (const list of this.#waiting.values()) for (const w of list.splice(0)) w.resolve(undefined);
    const all = [...this.#idle.values()].flat();
    this.#idle.clear();
    await Promise.allSettled([...all.map((w) => w.kill()), ...this.#retiring]);
  }

  /** Edge-internal sandboxes: never listed to the control plane, never callable through it. */
  owns(id: string): boolean {
    return isWorkerId(id);
  }

  get workers(): number {
    return this.#total;
  }

  async run(req: EdgeFnRequest, signal?: AbortSignal): Promise<FnRunResult> {
    if (this.#stopped) throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.edge.id} is shutting down`);
    const key = JSON.stringify([req.tenant ?? null, req.imageId, req.call.memoryMiB, req.call.diskMiB, req.call.network ?? false]);
    const started = performance.now();
    const { worker, cold } = await this.#acquire(key, req, signal);
    let released = false;
    try {
      const { result, damage } = await worker.run(req.call);
      this.stats.calls++;
      if (damage !== undefined) {
        this.stats.replaced++;
        this.opts.log.info({ worker: worker.id, why: damage }, 'fn worker replaced after a call');
        released = true;
        void this.#retire(worker);
      } else {
        released = true;
        this.#release(worker);
      }
      return { ...result, coldStart: cold, durationMs: Math.round((performance.now() - started) * 100) / 100 };
    } finally {
      if (!released) void this.#retire(worker);
    }
  }

  async #acquire(key: string, req: EdgeFnRequest, signal?: AbortSignal): Promise<{ worker: FnWorker; cold: boolean }> {
    for (;;) {
      const idle = this.#idle.get(key);
      while (idle?.length) {
        const w = idle.pop()!;
        if (!w.dead) return { worker: w, cold: false };
        void this.#retire(w);
      }
      if ((this.#count.get(key) ?? 0) < this.#maxPerKind && this.#total < this.#max) {
        this.#count.set(key, (this.#count.get(key) ?? 0) + 1);
        this.#total++;
        try {
          const w = await this.#startSlot(() => FnWorker.start(this.edge, key, req));
          this.stats.coldStarts++;
          return { worker: w, cold: true };
        } catch (err) {
          this.#count.set(key, this.#count.get(key)! - 1);
          this.#total--;
          this.#wakeAny();
          throw err;
        }
      }
      // The node is at its worker limit for this kind: wait for a worker to come back. When
      // another kind holds the node's room, its least recently used idle worker makes way.
      if (this.#total >= this.#max) await this.#evictIdle(key);
      if (this.#total < this.#max && (this.#count.get(key) ?? 0) < this.#maxPerKind) continue;
      const w = await new Promise<FnWorker | undefined>((resolve, reject) => {
        const waiter: Waiter = { resolve };
        const list = this.#waiting.get(key) ?? [];
        list.push(waiter);
        this.#waiting.set(key, list);
        signal?.addEventListener(
          'abort',
          () => {
            const l = this.#waiting.get(key);
            if (l) l.splice(l.indexOf(waiter) >>> 0, 1);
            reject(new ApiError('INVALID_REQUEST', 'the caller went away while the call waited for a worker'));
          },
          { once: true },
        );
      });
      if (this.#stopped) throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.edge.id} is shutting down`);
      if (w && !w.dead) return { worker: w, cold: false };
      if (w) void this.#retire(w);
    }
  }

  /**
   * Runs a worker start when one of STARTS_AT_ONCE slots is free: 32 python3s importing their
   * standard library at once on a 2-core node each take 32 times as long, and all calls wait for
   * the slowest; a few at a time, the first workers serve calls while the rest start.
   */
  async #startSlot<T>(start: () => Promise<T>): Promise<T> {
    if (this.#starting >= STARTS_AT_ONCE) await new Promise<void>((resolve) => this.#startQueue.push(resolve));
    this.#starting++;
    try {
      return await start();
    } finally {
      this.#starting--;
      this.#startQueue.shift()?.();
    }
  }

  /** A fit worker goes to the next waiter of its kind, or back to the idle list. */
  #release(w: FnWorker): void {
    if (this.#stopped) {
      void this.#retire(w);
      return;
    }
    const next = this.#waiting.get(w.key)?.shift();
    if (next) next.resolve(w);
    else {
      const list = this.#idle.get(w.key) ?? [];
      list.push(w);
      this.#idle.set(w.key, list);
      // Room was freed for another kind only if some kind waits on the node's limit.
      if (this.#total >= this.#max) this.#wakeAny();
    }
  }

  /** Kills a worker and frees its room; a waiter of its kind then starts a fresh one. */
  async #retire(w: FnWorker): Promise<void> {
    this.#count.set(w.key, (this.#count.get(w.key) ?? 1) - 1);
    this.#total--;
    const killing = w.kill().catch((err: unknown) => this.opts.log.error({ err, worker: w.id }, 'killing an fn worker failed'));
    this.#retiring.add(killing);
    await killing;
    this.#retiring.delete(killing);
    const next = this.#waiting.get(w.key)?.shift();
    if (next) next.resolve(undefined);
    else this.#wakeAny();
  }

  /** Wakes one waiter of any kind (room on the node was freed). */
  #wakeAny(): void {
    for (const list of this.#waiting.values()) {
      const next = list.shift();
      if (next) {
        next.resolve(undefined);
        return;
      }
    }
  }

  /** Kills the least recently used idle worker of another kind, to make room for `key`. */
  async #evictIdle(key: string): Promise<void> {
    let victim: FnWorker | undefined;
    for (const [k, list] of this.#idle) {
      if (k === key) continue;
      for (const w of list) if (!victim || w.lastUsed < victim.lastUsed) victim = w;
    }
    if (!victim) return;
    const list = this.#idle.get(victim.key)!;
    list.splice(list.indexOf(victim), 1);
    await this.#retire(victim);
  }

  async #reapIdle(): Promise<void> {
    const now = Date.now();
    for (const list of this.#idle.values()) {
      for (const w of [...list]) {
        if (now - w.lastUsed < this.#idleMs) continue;
        list.splice(list.indexOf(w), 1);
        await this.#retire(w);
      }
    }
  }
}
