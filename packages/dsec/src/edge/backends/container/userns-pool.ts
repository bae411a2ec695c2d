import { closeSync, mkdirSync, openSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { mountsUnder } from '../../../host/mounts.js';
import type { SpawnHelper } from '../../../host/spawn-helper.js';
import { MS_BIND, mount } from '../../../host/syscalls.js';
import type { UidRange, UidRangePool } from '../../../host/uid-ranges.js';
import { makeUserns } from './idmapped-root.js';
import { tryUnmount } from '../../node/layer-mounts.js';

/** Namespaces an edge keeps made ahead by default (EdgeOptions.usernsPool). */
export const DEFAULT_USERNS_POOL = 2;

/** A user namespace made ahead: its range claimed host-wide for `holder`, the namespace bound on `file`. */
export interface PooledUserns {
  range: UidRange;
  file: string;
  holder: string;
}

/**
 * User namespaces made ahead of creates (edge option `usernsPool`), so a create of a
 * user-namespaced sandbox does not wait for dsec-idmap (a process, 2–6 ms, the largest step of a
 * create that is dsec's own). Each is what a create would make: a host uid range claimed
 * host-wide (host/uid-ranges.ts, for a holder named `userns-pool.<pid>-<n>`, never a sandbox id) and
 * the namespace dsec-idmap made for it, bound on `<dir>/<holder>`. A create takes one: the claim is
 * handed over to the sandbox in one rename (no other edge can get the range in between), and the
 * edge binds the namespace into the sandbox's dir. With none ready a create makes its own, as
 * without a pool: it never waits for the refill, which runs in the background, one at a time,
 * after the create that took one (so its dsec-idmap does not compete with that create's crun).
 *
 * After a crash, the next start removes every bind and file left here before the uid ranges'
 * reconcile gives back the claims of holders that are not live sandboxes (these included).
 */
export class UsernsPool {
  readonly #ready: PooledUserns[] = [];
  /** Taken and done with: their binds here are removed on the next turn of the event loop. */
  readonly #spent: PooledUserns[] = [];
  #filling = false;
  #fill: Promise<void> = Promise.resolve();
  #closed = false;
  #made = 0;

  constructor(
    private readonly o: {
      dir: string;
      /** How many to keep ready; 0: none (no dir either). */
      size: number;
      ranges: UidRangePool;
      spawner: SpawnHelper | undefined;
      log: Logger;
    },
  ) {}

  /** How many are ready now (tests, inspection). */
  get ready(): number {
    return this.#ready.length;
  }

  /** Resolves when the refill in progress, if any, has stopped (tests, inspection). */
  settled(): Promise<void> {
    return this.#fill;
  }

  /** The namespaces' files, ready ones only (tests, inspection). */
  files(): string[] {
    return this.#ready.map((e) => e.file);
  }

  /**
   * At an edge's start, before the uid ranges' reconcile: unmounts and removes whatever a
   * previous run left here (their claims, whose holders are no live sandbox, go with the reconcile).
   * Throws when a bind cannot be removed: the edge must not start over a namespace it lost track of.
   */
  clearLeftovers(): number {
    const binds = mountsUnder(this.o.dir).reverse();
    for (const m of binds) tryUnmount(m.mountPoint);
    rmSync(this.o.dir, { recursive: true, force: true });
    if (this.o.size > 0) mkdirSync(this.o.dir, { recursive: true, mode: 0o700 });
    return binds.length;
  }

  /**
   * A ready namespace for sandbox `sandboxId`, its range's claim now the sandbox's; undefined when
   * none is ready (the caller makes its own). The caller calls done() then refill() when its create is over.
   */
  take(sandboxId: string): PooledUserns | undefined {
    for (let e = this.#ready.shift(); e; e = this.#ready.shift()) {
      let handedOver: boolean;
      try {
        handedOver = this.o.ranges.handOver(e.range.slot, e.holder, sandboxId);
      } catch (err) {
        // Out of the ready list already: dropped here, or its bind would stay until a restart
        // and make close() fail on its busy dir.
        this.#discard(e);
        throw err;
      }
      if (handedOver) return { ...e, holder: sandboxId };
      // Its claim is not the pool's any more (removed behind the edge's back): not usable.
      this.o.log.error({ slot: e.range.slot, holder: e.holder }, 'a pooled user namespace lost its uid range claim; dropping it');
      this.#discard(e);
    }
    return undefined;
  }

  /**
   * Binds a taken namespace on `target` (the sandbox's own namespace file, where a create without
   * the pool makes it), so the sandbox's dir holds it as if made there. Its bind in the pool's dir
   * stays until the create calls done().
   */
  bindTo(e: PooledUserns, target: string): void {
    closeSync(openSync(target, 'w', 0o400));
    mount(e.file, target, '', MS_BIND, null);
  }

  /**
   * A taken namespace is bound in its sandbox's dir now (or its create failed): its bind and file
   * in the pool's dir are removed right after, off the create's path (an unmount waits for an RCU
   * grace period). Its range is the sandbox's.
   */
  done(e: PooledUserns): void {
    this.#spent.push(e);
    setImmediate(() => this.#dropSpent());
  }

  /** Starts making namespaces in the background until `size` are ready; one at a time, never twice at once. */
  refill(): void {
    if (this.#filling || this.#closed || this.#ready.length >= this.o.size) return;
    this.#filling = true;
    this.#fill = this.#fillUp();
  }

  /** Runs from setImmediate: a failure is logged, never thrown (it would end the edge's process). */
  #dropSpent(): void {
    for (let e = this.#spent.shift(); e; e = this.#spent.shift()) {
      try {
        this.#unbind(e);
      } catch (err) {
        this.o.log.error(
          { file: e.file, err: (err as Error).message },
          "could not remove a used pooled user namespace's bind; the next start clears it",
        );
      }
    }
  }

  async #fillUp(): Promise<void> {
    try {
      await new Promise((resolve) => setImmediate(resolve)); // after the create that called this has answered
      while (!this.#closed && this.#ready.length < this.o.size) await this.#makeOne();
    } catch (err) {
      // Creates make their own meanwhile; the next one done tries again.
      this.o.log.warn({ err: (err as Error).message }, 'could not make a user namespace ahead for the pool');
    } finally {
      this.#filling = false;
    }
  }

  async #makeOne(): Promise<void> {
    // The pid too: a dsec-idmap a crashed edge left running must not bind onto a path reused here.
    const holder = `userns-pool.${process.pid}-${++this.#made}`;
    // The file before the claim: whoever sees a pool holder's claim finds its file here.
    const file = join(this.o.dir, holder);
    closeSync(openSync(file, 'w', 0o400));
    let range: UidRange;
    try {
      range = this.o.ranges.take(holder);
    } catch (err) {
      rmSync(file, { force: true });
      throw err;
    }
    const e: PooledUserns = { range, file, holder };
    try {
      await makeUserns(range, e.file, this.o.spawner);
    } catch (err) {
      this.#discard(e);
      throw err;
    }
    if (this.#closed) this.#discard(e);
    else this.#ready.push(e);
  }

  /** Unmounts and removes a namespace's file and gives back its range. */
  #discard(e: PooledUserns): void {
    this.#unbind(e);
    this.o.ranges.release(e.holder);
  }

  #unbind(e: PooledUserns): void {
    tryUnmount(e.file);
    rmSync(e.file, { force: true });
  }

  /**
   * An edge's graceful stop: waits for a namespace being made, then removes every one and the dir.
   * Any bind still in the dir after that is one the pool lost track of (a suite run once found
   * one there at a stop, after a test had killed dsec-spawn while the pool was refilling: a tool
   * outlives the helper that started it): nothing in the dir is a sandbox's (a create's taken
   * namespace is bound in its own dir), so it is removed too, and named in the log.
   */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#fill;
    this.#dropSpent();
    for (let e = this.#ready.shift(); e; e = this.#ready.shift()) this.#discard(e);
    const strays = mountsUnder(this.o.dir).reverse();
    for (const m of strays) {
      this.o.log.warn({ mountPoint: m.mountPoint }, 'a bind in the user namespace pool that the pool had lost track of; removed');
      tryUnmount(m.mountPoint);
    }
    rmSync(this.o.dir, { recursive: true, force: true });
  }
}
