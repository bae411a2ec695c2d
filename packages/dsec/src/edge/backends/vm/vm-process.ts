import { CappedOutput } from '../shared/capped-output.js';
import type { OutputListener, ProcessExit, StartOptions, StreamName } from '../shared/command-process.js';
import { signalNumber } from '../../../host/run-tool.js';
import type { AgentClient } from './agent-client.js';
import type { AgentFrame } from './agent-frames.js';

/** argv, env, cwd and user of a command, resolved on the edge; the agent runs it as given. */
export interface GuestCommand {
  argv: string[];
  env: string[];
  cwd: string;
  uid: number;
  gid: number;
  /**
   * A Landlock domain of its own in the guest (landlock_apply in vm-agent.c): `isolate` changes no
   * file right that matters; `rw` confines changes to files beneath those paths. Either fails closed.
   */
  isolate?: boolean;
  rw?: string[];
  /** A cgroup in the guest shared with the other commands of one session (ended by kill_group). */
  group?: string;
}

/**
 * Bytes of a command's stdout and stderr the agent sends before the edge grants more: the edge
 * grants each chunk back as it arrives unless a reader paused the command (a slow client of a
 * streamed exec or tar download), so then the guest's writer blocks on its own pipe and the edge
 * holds at most this much of it (plus one pipe's 64 KiB at the exit).
 */
export const EXEC_WINDOW_BYTES = 1 << 20;

/**
 * One command in a VM guest, run by the guest agent in its own session (process group), with the
 * same surface as a container's SandboxProcess: capped output, stdin, signals, timeout. A signal
 * goes to the command's whole process group, so SIGKILL ends what it started too. pause() and
 * resume() are flow control over the channel (EXEC_WINDOW_BYTES), as a container's pause its pipes.
 */
export class VmProcess {
  readonly stdout: CappedOutput;
  readonly stderr: CappedOutput;
  readonly done: Promise<ProcessExit>;
  /** The command's exit status; the agent sends it after the last output, so it comes with done. */
  readonly exited: Promise<number>;
  /** Output on fd 3 when asked for (StartOptions.fd3MaxBytes): a session's state. */
  readonly fd3: CappedOutput | undefined;
  /** fd 3's end: the agent drains it before the exit, so it ends with the command. */
  readonly fd3Ended: Promise<void>;
  readonly startedAt = new Date();
  /** performance.now() when it was asked of the guest agent (the end of a command's wait). */
  readonly spawnedAt = performance.now();
  #exit: ProcessExit | undefined;
  readonly #listeners = new Set<OutputListener>();
  readonly #agent: AgentClient;
  readonly #id: number;
  #stdinOpen: boolean;
  #timedOut = false;
  #killed = false;
  #paused = false;
  /** Output bytes that arrived while paused: granted back on resume. */
  #owed = 0;

  constructor(agent: AgentClient, cmd: GuestCommand, opts: StartOptions) {
    this.#agent = agent;
    this.stdout = new CappedOutput(opts.maxOutputBytes);
    this.stderr = new CappedOutput(opts.maxOutputBytes);
    const started = performance.now();
    const withStdin = opts.stdin === true || opts.input !== undefined;
    this.#stdinOpen = withStdin;
    this.fd3 = opts.fd3MaxBytes === undefined ? undefined : new CappedOutput(opts.fd3MaxBytes);
    let resolveDone!: (e: ProcessExit) => void;
    this.done = new Promise((r) => (resolveDone = r));
    this.exited = this.done.then((e) => e.exitCode);
    this.fd3Ended = this.done.then(() => undefined);
    let timer: NodeJS.Timeout | undefined;
    const finish = (exitCode: number): void => {
      if (this.#exit) return;
      if (timer) clearTimeout(timer);
      this.#agent.release(this.#id);
      this.#stdinOpen = false;
      this.#exit = {
        exitCode: this.#timedOut ? 137 : exitCode,
        timedOut: this.#timedOut,
        killed: this.#killed,
        durationMs: Math.round((performance.now() - started) * 100) / 100,
      };
      resolveDone(this.#exit);
    };
    const onEvent = (f: AgentFrame): void => {
      const ev = f.header['ev'];
      if (ev === 'stdout' || ev === 'stderr') {
        this.#emit(ev, f.payload);
        if (this.#paused) this.#owed += f.payload.length;
        else this.#grant(f.payload.length);
      } else if (ev === 'fd3') this.fd3?.push(f.payload);
      else if (ev === 'exit') finish(Number(f.header['code'] ?? 1));
      else if (ev === 'error') {
        // The agent could not start it (no such file, no permission): like a shell, 127 / 126.
        this.#emit('stderr', Buffer.from(`${String(f.header['message'] ?? 'cannot start the command')}\n`));
        finish(f.header['code'] === 'ENOENT' ? 127 : 126);
      } else if (ev === 'closed') {
        this.#emit('stderr', Buffer.from(`the VM's agent channel closed: ${String(f.header['message'] ?? '')}\n`));
        finish(137);
      }
    };
    const { argv, env, cwd, uid, gid, isolate, rw, group } = cmd;
    const fields = {
      argv,
      env,
      cwd,
      uid,
      gid,
      stdin: withStdin,
      window: EXEC_WINDOW_BYTES,
      ...(isolate ? { isolate } : {}),
      ...(rw ? { rw } : {}),
      ...(group ? { group } : {}),
      ...(this.fd3 ? { fd3: true } : {}),
    };
    this.#id = agent.send('exec', fields, undefined, onEvent);
    if (opts.input !== undefined) {
      if (opts.input.length) this.writeStdin(opts.input);
      if (!opts.stdin) this.endStdin();
    }
    if (opts.timeoutMs !== undefined) {
      timer = setTimeout(() => {
        this.#timedOut = true;
        this.kill();
      }, opts.timeoutMs);
    }
  }

  get exit(): ProcessExit | undefined {
    return this.#exit;
  }

  onOutput(listener: OutputListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #emit(stream: StreamName, raw: Buffer): void {
    const kept = this[stream].push(raw);
    for (const l of this.#listeners) l(stream, raw, kept);
  }

  writeStdin(data: Buffer): boolean {
    if (!this.#stdinOpen || this.#exit) return false;
    this.#agent.write({ op: 'stdin', id: this.#id }, data);
    return true;
  }

  endStdin(): void {
    if (!this.#stdinOpen || this.#exit) return;
    this.#stdinOpen = false;
    this.#agent.write({ op: 'stdin', id: this.#id, eof: true });
  }

  /** Stops granting output back: the agent stops reading the command's pipes once the window is used. */
  pause(): void {
    this.#paused = true;
  }

  resume(): void {
    if (!this.#paused) return;
    this.#paused = false;
    const n = this.#owed;
    this.#owed = 0;
    this.#grant(n);
  }

  #grant(bytes: number): void {
    if (bytes <= 0 || this.#exit) return;
    try {
      this.#agent.write({ op: 'credit', id: this.#id, bytes });
    } catch {
      // the channel is gone; the exit comes from its close
    }
  }

  async signal(sig: NodeJS.Signals): Promise<void> {
    if (this.#exit) return;
    if (sig === 'SIGKILL') this.#killed = true;
    try {
      this.#agent.write({ op: 'signal', id: this.#id, signal: signalNumber(sig) });
    } catch {
      // the channel is gone; the exit comes from its close
    }
  }

  /** SIGKILL to the command's process group (`now` changes nothing: the agent kills at once). */
  kill(_opts: { now?: boolean } = {}): void {
    void this.signal('SIGKILL');
  }
}
