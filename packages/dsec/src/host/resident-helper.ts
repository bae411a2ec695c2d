import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';

/** One answer cut off the front of a helper's output. */
export interface DecodedAnswer<A> {
  /** Bytes the answer took (header and body). */
  size: number;
  /** The request it answers; absent for a helper that answers in request order (the oldest one pending). */
  id?: number;
  answer: A;
  /** Word on the way, not the answer: handed to the request's onProgress, which stays pending. */
  progress?: boolean;
}

/** How a client speaks to its helper; only this differs between the edge's resident helpers. */
export interface HelperFraming<A> {
  /** The helper's name in errors (`dsec-spawn`). */
  name: string;
  /** The client's error class, so callers can tell a helper failure apart. */
  error: (message: string) => Error;
  /** The next answer at the front of `buf`; `incomplete` while its bytes are still coming, `garbled` when out of step. */
  decode: (buf: Buffer) => DecodedAnswer<A> | 'incomplete' | 'garbled';
}

interface Pending<A> {
  resolve: (answer: A) => void;
  reject: (err: Error) => void;
  onProgress?: ((answer: A) => void) | undefined;
}

/**
 * A small resident helper process of the edge's own (dsec-spawn, dsec-nft), talked to over its
 * stdin and stdout: started on first use, requests in flight at once, each answered when the
 * helper writes its answer. A helper that dies (or cannot start, or writes what cannot be read)
 * fails the requests in flight with its stderr's tail, and the next request starts a new one.
 * Gone when its stdin closes (also when the edge dies).
 */
export class ResidentHelper<A> {
  #child: ChildProcessWithoutNullStreams | undefined;
  /** In request order (a Map iterates in insertion order): the oldest is first. */
  readonly #pending = new Map<number, Pending<A>>();
  #next = 1;
  /** Messages waiting for the next request (notifyLater), for the helper whose pid is #laterPid. */
  #later: (string | Buffer)[] = [];
  #laterPid: number | undefined;
  #laterTimer: NodeJS.Timeout | undefined;
  #buf = Buffer.alloc(0);
  #stderr = '';

  constructor(
    private readonly binary: string,
    private readonly framing: HelperFraming<A>,
    private readonly args: readonly string[] = [],
  ) {}

  /**
   * Sends the request `encode` makes from the id the answer will carry; resolves to the answer,
   * rejects only when the helper fails. Answers decoded as progress go to `onProgress` first.
   */
  request(encode: (id: number) => readonly (string | Buffer)[], onProgress?: (answer: A) => void): Promise<A> {
    const child = this.#ensure();
    const id = this.#next++;
    return new Promise<A>((resolve, reject) => {
      if (this.#pending.size === 0) this.#hold(child, true);
      this.#pending.set(id, { resolve, reject, onProgress });
      child.stdin.write(joined([...this.#takeLater(child), ...encode(id)]));
    });
  }

  /**
   * As notify(), for a message that may wait up to `maxDelayMs`: it goes out with the next request
   * (in the same write), or alone when none comes in time. Each write wakes the helper, which on a
   * small host takes the CPU from the edge; a command's `release` sent alone was a second wake-up
   * of every exec.
   */
  notifyLater(pid: number | undefined, parts: readonly (string | Buffer)[], maxDelayMs: number): void {
    const child = this.#child;
    if (!child || pid === undefined || child.pid !== pid) return;
    if (this.#laterPid !== pid) this.#later = []; // for a helper gone since: moot
    this.#laterPid = pid;
    this.#later.push(...parts);
    if (this.#laterTimer) return;
    this.#laterTimer = setTimeout(() => {
      this.#laterTimer = undefined;
      const c = this.#child;
      if (c) {
        const parts = this.#takeLater(c);
        if (parts.length) c.stdin.write(joined(parts));
      }
    }, maxDelayMs);
    this.#laterTimer.unref();
  }

  /** The waiting messages for `child` (dropped when they were for another helper), no longer waiting. */
  #takeLater(child: ChildProcessWithoutNullStreams): (string | Buffer)[] {
    if (this.#later.length === 0) return [];
    const parts = this.#laterPid === child.pid ? this.#later : [];
    this.#later = [];
    clearTimeout(this.#laterTimer);
    this.#laterTimer = undefined;
    return parts;
  }

  /**
   * Writes a message that gets no answer (about a request in flight) to the helper with pid
   * `pid` only: a helper started since knows nothing of that request.
   */
  notify(pid: number | undefined, parts: readonly (string | Buffer)[]): void {
    const child = this.#child;
    if (!child || pid === undefined || child.pid !== pid) return;
    child.stdin.write(joined(parts));
  }

  /** Stops the helper (it exits when its stdin closes). */
  async close(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    const later = this.#takeLater(child);
    if (later.length) child.stdin.write(joined(later));
    const exited = new Promise<void>((res) => child.once('exit', () => res()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }

  /** The helper's pid while it runs (tests kill it to see a restart). */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  #ensure(): ChildProcessWithoutNullStreams {
    if (this.#child) return this.#child;
    const child = spawn(this.binary, [...this.args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#child = child;
    this.#buf = Buffer.alloc(0);
    this.#stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, chunk]);
      this.#drain();
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-4096)));
    const fail = (why: string): void => {
      if (this.#child !== child) return;
      this.#child = undefined;
      const err = this.framing.error(`${this.framing.name} ${why}${this.#stderr ? `: ${this.#stderr.trim()}` : ''}`);
      const pending = [...this.#pending.values()];
      this.#pending.clear();
      for (const p of pending) p.reject(err);
    };
    child.on('error', (err) => fail(`could not run (${err.message}; run scripts/setup to build it)`));
    child.on('exit', (code, signal) => fail(`exited (${signal ?? code})`));
    child.stdin.on('error', () => undefined); // a dead helper: reported by 'exit'
    // An idle helper must not keep the edge's process alive; one with answers due must.
    child.unref();
    this.#hold(child, false);
    return child;
  }

  #hold(child: ChildProcessWithoutNullStreams, on: boolean): void {
    // The process handle too: when the helper dies its pipes close first, and with only they
    // held, the loop could end before the exit that fails the calls in flight is seen.
    if (on) child.ref();
    else child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) {
      const h = s as unknown as { ref?: () => void; unref?: () => void };
      if (on) h.ref?.();
      else h.unref?.();
    }
  }

  #drain(): void {
    for (;;) {
      const decoded = this.framing.decode(this.#buf);
      if (decoded === 'incomplete') return;
      if (decoded === 'garbled') {
        this.#child?.kill('SIGKILL'); // out of step: its 'exit' fails what is pending
        return;
      }
      this.#buf = this.#buf.subarray(decoded.size);
      if (decoded.progress) {
        if (decoded.id !== undefined) this.#pending.get(decoded.id)?.onProgress?.(decoded.answer);
        continue;
      }
      const id = decoded.id ?? this.#pending.keys().next().value;
      const p = id === undefined ? undefined : this.#pending.get(id);
      if (id !== undefined) this.#pending.delete(id);
      if (this.#pending.size === 0 && this.#child) this.#hold(this.#child, false);
      p?.resolve(decoded.answer);
    }
  }
}

/**
 * A message's parts as one write: each write to the helper's stdin is a system call that wakes
 * the helper, which otherwise reads a request's header, polls again and reads its body (two
 * wake-ups on a command's path where one does).
 */
function joined(parts: readonly (string | Buffer)[]): string | Buffer {
  if (parts.length === 1) return parts[0]!;
  return Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p) : p)));
}
