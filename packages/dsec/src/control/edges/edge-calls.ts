import type { ClientRequest } from 'node:http';

/** Why a call to an edge ended before its answer: the edge was lost, the call ran out of time, or its caller gave up. */
export class CallEnded extends Error {
  constructor(
    readonly why: 'lost' | 'timeout' | 'caller',
    /** The caller's abort reason (why === 'caller'). */
    readonly reason?: unknown,
  ) {
    super(`the call to the edge ended before its answer: ${why}`);
  }
}

/**
 * The JSON calls in flight to one edge, each ended by a plain timer, the edge's loss or its
 * caller's signal, without an AbortSignal of its own. An AbortSignal.any of the edge's loss and an
 * AbortSignal.timeout per call, handed to http.request, cost the caller more CPU than the request
 * itself: 173 against 71 µs per request on a kept-alive loopback connection (node:http, 6 in
 * flight, this 2-core machine), and a create group is one such request.
 */
export class EdgeCalls {
  readonly #calls = new Set<EdgeCall>();

  /** A call that ends after `timeoutMs` (none: no limit) or when `signal` aborts; `done` it when it settles. */
  start(timeoutMs: number | undefined, signal: AbortSignal | undefined): EdgeCall {
    return new EdgeCall(this.#calls, timeoutMs, signal);
  }

  /** Calls in flight (tests: none is left behind once settled). */
  get size(): number {
    return this.#calls.size;
  }

  /** Ends every call in flight (the edge was declared lost); calls started later are not affected. */
  endAll(): void {
    for (const call of [...this.#calls]) call.end('lost');
  }
}

export class EdgeCall {
  #req: ClientRequest | undefined;
  #ended: CallEnded | undefined;
  readonly #timer: NodeJS.Timeout | undefined;
  readonly #onAbort: (() => void) | undefined;

  constructor(
    private readonly calls: Set<EdgeCall>,
    timeoutMs: number | undefined,
    private readonly signal: AbortSignal | undefined,
  ) {
    // In the set before anything can end it: a call whose caller had already aborted ends here,
    // and its done() must find it there to take it out.
    calls.add(this);
    if (timeoutMs !== undefined) this.#timer = setTimeout(() => this.end('timeout'), timeoutMs).unref();
    if (signal?.aborted) this.end('caller', signal.reason);
    else if (signal) {
      this.#onAbort = () => this.end('caller', signal.reason);
      signal.addEventListener('abort', this.#onAbort, { once: true });
    }
  }

  /** Why the call ended early, if it did: what its caller is told, whatever error the request then gave. */
  get ended(): CallEnded | undefined {
    return this.#ended;
  }

  /** The request now carrying the call (a retry's replaces the first); destroyed at once if the call has ended. */
  attach(req: ClientRequest): void {
    this.#req = req;
    if (this.#ended) req.destroy(this.#ended);
  }

  end(why: CallEnded['why'], reason?: unknown): void {
    if (this.#ended) return;
    this.#ended = new CallEnded(why, reason);
    this.#req?.destroy(this.#ended);
    this.done();
  }

  /** The call settled: its timer, listener and place among the calls in flight go. */
  done(): void {
    if (this.#timer) clearTimeout(this.#timer);
    if (this.#onAbort) this.signal?.removeEventListener('abort', this.#onAbort);
    this.calls.delete(this);
  }
}
