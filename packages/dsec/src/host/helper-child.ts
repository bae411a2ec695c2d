import { EventEmitter } from 'node:events';
import { closeSync, constants, openSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import { PassThrough, type Readable, type Writable } from 'node:stream';

/**
 * What a streamed tool's fd is: /dev/null, a pipe the edge writes (`in`) or reads (`out`), a
 * host file opened for writing in the tool (`{ write: path }`, e.g. a command cgroup's
 * cgroup.procs for `crun exec --preserve-fds`), or a pipe that holds `data` and is at its end
 * after it (`{ data }`, at most PLAN_DATA_MAX bytes: a command's whole stdin, known at its start,
 * which the helper writes before the tool starts, so the tool need not wait for the edge to open
 * the pipe).
 */
export type FdPlan = 'null' | 'in' | 'out' | { write: string } | { data: Buffer };

/** The most a `{ data }` plan holds: what a pipe takes without a reader (its default size is 64 KiB). */
export const PLAN_DATA_MAX = 32 << 10;

/** How dsec-spawn is told about one planned fd (see native/spawn-helper.c). */
export function planWord(p: FdPlan): string {
  if (typeof p === 'string') return p;
  return 'write' in p ? `w:${p.write}` : `d:${p.data.toString('hex')}`;
}

/** The calls a HelperChild makes back to its helper. */
export interface HelperChildControl {
  release(id: number): void;
  kill(id: number, signal: number): void;
}

/**
 * A tool that dsec-spawn started with its stdio streamed to the edge (`crun exec`): the subset
 * of a ChildProcess the exec engine uses. `stdio[fd]` is the edge's side of each planned pipe,
 * there from the start (a stream that is joined to the pipe once the helper says where it is, so
 * stdin written at once waits, and pause() holds the tool back as on a ChildProcess's pipe);
 * `exit` carries the status as one number (128 + the signal's number for a signal), `close`
 * follows once it has exited and its output pipes have closed, as for a ChildProcess.
 */
export class HelperChild extends EventEmitter {
  pid: number | undefined;
  exitCode: number | null = null;
  readonly signalCode = null;
  readonly stdio: (PassThrough | null)[];
  #openOutputs = 0;
  #started = false;
  #stdinPipe: Socket | undefined;

  constructor(
    readonly id: number,
    private readonly plan: readonly FdPlan[],
    private readonly control: HelperChildControl,
  ) {
    super();
    this.stdio = plan.map((p) => (p === 'in' || p === 'out' ? new PassThrough() : null));
    this.stdio.forEach((s, i) => {
      if (!s || plan[i] !== 'out') return;
      this.#openOutputs++;
      s.once('close', () => {
        this.#openOutputs--;
        this.#maybeClose();
      });
    });
  }

  get stdin(): Writable | null {
    return this.stdio[0] ?? null;
  }

  get stdout(): Readable | null {
    return this.stdio[1] ?? null;
  }

  get stderr(): Readable | null {
    return this.stdio[2] ?? null;
  }

  /**
   * The helper started the tool and holds the pipes' ends at `fds` (its own fd numbers): opens
   * each through /proc (the same pipe, in an open file description of the edge's own), joins it
   * to its stream, then lets the helper close its copies.
   */
  started(pid: number, helperPid: number, fds: readonly number[]): void {
    this.pid = pid;
    this.#started = true;
    try {
      this.plan.forEach((p, i) => {
        const at = fds[i] ?? -1;
        const side = this.stdio[i];
        if (!side || at < 0) return;
        const flags = (p === 'in' ? constants.O_WRONLY : constants.O_RDONLY) | constants.O_NONBLOCK; // libuv adds O_CLOEXEC
        const fd = openSync(`/proc/${helperPid}/fd/${at}`, flags);
        let pipe: Socket;
        try {
          // allowHalfOpen: a write-only pipe has no readable side, whose end would otherwise end it early.
          pipe = new Socket({ fd, readable: p === 'out', writable: p === 'in', allowHalfOpen: true });
        } catch (err) {
          closeSync(fd);
          throw err;
        }
        pipe.on('error', () => undefined); // a command that exits without reading its stdin: EPIPE
        if (p === 'out') {
          pipe.pipe(side);
          side.once('close', () => pipe.destroy()); // the reader gave up on it (destroy())
        } else {
          side.pipe(pipe); // ends the pipe once what was written has gone out
          this.#stdinPipe = pipe;
        }
      });
      this.emit('spawn');
    } catch (err) {
      // The tool would run without the edge reading it: end it, say why.
      this.control.kill(this.id, 9);
      this.emit('error', err as Error);
    } finally {
      this.control.release(this.id);
    }
  }

  /** Whether the helper said `started` (a later 127 with a reason is then the tool's own exit). */
  get wasStarted(): boolean {
    return this.#started;
  }

  exited(status: number): void {
    this.exitCode = status;
    // As a ChildProcess does: nothing reads stdin any more, so it goes (with its fd) even when
    // the caller never ended it.
    this.stdin?.destroy();
    this.#stdinPipe?.destroy();
    this.emit('exit', status, null);
    this.#maybeClose();
  }

  /** The tool could not be started, or the helper died under it. */
  failed(err: Error): void {
    this.emit('error', err);
    for (const side of this.stdio) side?.destroy(); // an output's close takes its pipe with it
    this.#stdinPipe?.destroy();
  }

  /** Signals the tool, through the helper, only while it has not been reaped (never a recycled pid). */
  kill(signal: NodeJS.Signals | number = 'SIGTERM'): boolean {
    if (this.exitCode !== null) return false;
    const n = typeof signal === 'number' ? signal : osConstants.signals[signal];
    this.control.kill(this.id, n);
    return true;
  }

  #maybeClose(): void {
    if (this.exitCode !== null && this.#openOutputs === 0) this.emit('close', this.exitCode, null);
  }
}
