import { EventEmitter } from 'node:events';
import type { BatchEvent, CreateSandboxRequest } from '@dsec/sdk/schema';
import { isoTime } from '../iso-time.js';

/** An event as the driver emits it: its seq and time are the log's to give. */
export type Emitted = Omit<BatchEvent, 'seq' | 'at'>;

/**
 * A batch this process drives: its event log in memory (served to streams, written to the store
 * by BatchService's flushes), the counts and done items its events add up to, and the driver's
 * state. Each event's JSON is made once, when it is recorded: the store's runs and the streams'
 * lines are built from it.
 */
export class LiveBatch {
  readonly events: BatchEvent[] = [];
  readonly #texts: string[] = [];
  readonly #bus = new EventEmitter();
  readonly done = new Set<number>();
  placed = 0;
  running = 0;
  failed = 0;
  cancelled = false;
  finished = false;
  /**
   * Another replica took it over (this one's lease ran out: a stall, not a death): this one stops
   * driving it and writes none of its events, which the new owner numbers from where it began.
   */
  handedOver = false;
  /** Indexes into events not yet written to the store. */
  #unflushed: number[] = [];
  /** Settles when the driver stops (done, cancelled, or this process stopping). */
  driver: Promise<void> = Promise.resolve();

  constructor(
    readonly id: string,
    readonly count: number,
    readonly spec: CreateSandboxRequest,
    readonly createdAt: string,
    readonly project: string,
    /** Creates in flight at most (BatchService's #concurrency, kept with the batch's request). */
    readonly concurrency: number,
  ) {
    this.#bus.setMaxListeners(0);
  }

  /** An event from the store (a batch taken up again): in the log and counted, not to be written again. */
  load(e: BatchEvent): void {
    this.events.push(e);
    this.#texts.push(JSON.stringify(e));
    this.#count(e);
  }

  /**
   * A new event: numbered, stamped, counted, kept to be written, and told to the streams waiting
   * for one. The event is the caller's own new object, numbered and stamped in place. A copy
   * (`{ ...e, seq, at }`) went V8's slow way every time: each copy got a hidden class of its own,
   * so adding seq and at, its JSON and every later read of its fields missed V8's caches (7 % of
   * the control plane's thread placing a batch of 32,000, `perf` with `--perf-basic-prof`).
   */
  record(e: Emitted): void {
    const ev = e as BatchEvent;
    ev.seq = this.events.length;
    ev.at = isoTime();
    this.#unflushed.push(this.events.length);
    this.events.push(ev);
    this.#texts.push(JSON.stringify(ev));
    this.#count(ev);
    this.#bus.emit('event');
  }

  get hasUnflushed(): boolean {
    return this.#unflushed.length > 0;
  }

  /** The events not yet written, with their JSON, taken for a write; `at` gives them back (putBack) if it fails. */
  takeUnflushed(): { events: BatchEvent[]; texts: string[]; at: number[] } | undefined {
    if (this.#unflushed.length === 0) return undefined;
    const at = this.#unflushed.splice(0);
    return { events: at.map((i) => this.events[i]!), texts: at.map((i) => this.#texts[i]!), at };
  }

  /** Events a failed write took: first in line again, ahead of any recorded since (the store keeps only seqs above its last). */
  putBack(at: number[]): void {
    this.#unflushed = at.concat(this.#unflushed);
  }

  /** Drops what is not yet written (handed over: the new owner writes the batch's events). */
  dropUnflushed(): void {
    this.#unflushed = [];
  }

  /** The events from index `from` on, with their JSON. */
  runFrom(from: number): { events: BatchEvent[]; texts: string[] } {
    const end = this.events.length;
    return { events: this.events.slice(from, end), texts: this.#texts.slice(from, end) };
  }

  /** Settles at the next event recorded, or when `signal` aborts. */
  nextEvent(signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = (): void => {
        this.#bus.off('event', wake);
        signal?.removeEventListener('abort', wake);
        resolve();
      };
      this.#bus.on('event', wake);
      signal?.addEventListener('abort', wake, { once: true });
    });
  }

  #count(e: BatchEvent): void {
    if (e.type === 'placed') this.placed++;
    if (e.type === 'running') this.running++;
    if (e.type === 'failed') this.failed++;
    if ((e.type === 'running' || e.type === 'failed') && e.index !== undefined) this.done.add(e.index);
    if (e.type === 'done') this.finished = true;
    if (e.type === 'cancelled') {
      this.finished = true;
      this.cancelled = true;
    }
  }
}
