import type { EdgeSessionCarry } from '../../protocol/schemas.js';
import { randomBytes } from 'node:crypto';
import { ApiError } from '../../../api-error.js';
import type { ExecResult, OpenSessionRequest, SessionExecRequest, SessionInfo } from '@dsec/sdk/schema';
import { CappedOutput } from './capped-output.js';
import { rejectNul } from '../../protocol/reject-nul.js';
import { processFigures, type OutputListener, type ProcessExit, type ProcessFigures, type StreamName } from './command-process.js';
import { restoreScript, saveScript, parseSavedState, type SessionState } from './session-state.js';

/** Open sessions per sandbox (containers and VMs alike). */
export const MAX_SESSIONS = 32;

/** The shell process of one session command, whoever runs it (crun exec, a VM's guest agent). */
export interface SessionShellProcess {
  /** The shell's exit status (the kernel's), possibly before its pipes have drained. */
  readonly exited: Promise<number>;
  readonly done: Promise<ProcessExit>;
  readonly exit: ProcessExit | undefined;
  /** What the shell wrote on fd 3 (its state). */
  readonly fd3: CappedOutput | undefined;
  readonly fd3Ended: Promise<void>;
  onOutput(listener: OutputListener): () => void;
  kill(opts?: { now?: boolean }): void;
  /** performance.now() when its first process was asked for (the end of the command's wait). */
  readonly spawnedAt: number;
  /** Its CPU time and the sandbox's memory peak so far, where the host can tell (a session answers before its shell's end). */
  figuresNow?(): ProcessFigures;
}

/** How one shell of a session command starts in the sandbox. */
export interface SessionShellStart {
  cwd: string | undefined;
  env: Record<string, string> | undefined;
  /** After the first command: start with an empty environment (the saved state sets it). */
  clearEnv: boolean;
  writablePaths: string[] | undefined;
  /** The program (restore, command, save) fed on stdin. */
  input: Buffer;
  timeoutMs: number;
  /** Shared by every command of the session, so endTagged finds what they left running. */
  tag: string;
  /** fd 3 carries the shell's state, kept up to this many bytes. */
  fd3MaxBytes: number;
}

/** How the shell of a session's next command starts ahead, before its command is known. */
export type SessionStandbyStart = Omit<SessionShellStart, 'input' | 'timeoutMs'>;

/** A shell started ahead: running, its stdin a pipe, a command only from begin(). */
export interface SessionStandbyShell extends SessionShellProcess {
  /** Gives it its whole program on stdin (then closed) and starts its timeout: it is the command from now. */
  begin(input: Buffer, timeoutMs: number): void;
  /** Still waiting for begin(), its process alive. */
  readonly standing: boolean;
  /** Ends it, not yet begun: its own process only (never the session's jobs, which share its tag). */
  retire(): void;
  /** Its process's pid as the host sees it, once started. */
  readonly hostPid: number | undefined;
}

/**
 * What a session needs of its sandbox: a container's (exec/container-session.ts: crun exec) or a
 * VM's (edge/backends/vm/vm-session.ts: the guest agent). Each command must start in a Landlock
 * domain of its own, so a process an earlier command left running cannot reach into it.
 */
export interface SessionHost {
  startShell(argv: string[], opts: SessionShellStart): SessionShellProcess;
  /** OOM kills in the sandbox so far (a command that raised the count was OOM-killed). */
  oomKills(): number | Promise<number>;
  /** Ends every process left by the commands that share `tag`. */
  endTagged(tag: string): void | Promise<void>;
  /**
   * Starts the next command's shell ahead (ShellSession.prepare), or says no (undefined): where a
   * command would not start in a Landlock domain of its own, a shell waiting between commands
   * could be reached by what an earlier command left running; and while the sandbox is paused
   * or being moved. Hosts without it start every shell on demand.
   */
  standby?(argv: string[], opts: SessionStandbyStart): SessionStandbyShell | undefined;
}

/** Single-quotes a string for a POSIX shell. */
export function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** The most a session's saved state (variables, functions, cwd) may take. */
const MAX_STATE_BYTES = 8 << 20;

/**
 * Splits one stream of a session command into its output and the end marker (a line with a
 * random nonce, printed by the command's shell after the command): only what comes before the
 * marker is the command's output, so output of the command's background jobs that arrives
 * after it is not.
 */
class MarkerScanner {
  #pending: Buffer = Buffer.alloc(0);
  readonly output: CappedOutput;
  found = false;

  constructor(
    private readonly marker: Buffer,
    cap: number,
  ) {
    this.output = new CappedOutput(cap);
  }

  push(chunk: Buffer): void {
    if (this.found) return;
    this.#pending = this.#pending.length ? Buffer.concat([this.#pending, chunk]) : chunk;
    const at = this.#pending.indexOf(this.marker);
    if (at >= 0) {
      this.output.push(this.#pending.subarray(0, at));
      this.found = true;
      this.#pending = Buffer.alloc(0);
      return;
    }
    // Keep a tail long enough to hold a marker split across chunks; the rest is output.
    const keep = this.marker.length;
    if (this.#pending.length > keep) {
      this.output.push(this.#pending.subarray(0, this.#pending.length - keep));
      this.#pending = Buffer.from(this.#pending.subarray(this.#pending.length - keep));
    }
  }

  /** The command ended without a marker (it called `exit`): what is pending is output too. */
  flush(): void {
    if (!this.found && this.#pending.length) this.output.push(this.#pending);
    this.#pending = Buffer.alloc(0);
  }
}

/**
 * A persistent shell session in a sandbox whose cwd, variables and (bash) functions persist
 * across commands, where each command is a process of its own: a shell started by the session's
 * host (`crun exec` into a container, the guest agent's exec in a VM) that restores the state
 * the previous command left, runs the command, and hands its new state back on a pipe of its
 * own (fd 3).
 *
 * Why not one long-lived shell fed commands on its stdin (dsec's first design): every process a
 * session command puts in the background is a fork of that shell, in the same Landlock domain
 * and uid, so it can open the shell's stdin through /proc, read each later command and print the
 * end marker and exit status itself: a grader reusing the session is told whatever the job likes.
 * Here the exit status is the one the kernel reports for the command's shell (through crun exec
 * or the agent's waitpid), the output is what came through this command's own pipes, and each
 * command runs in a Landlock domain of its own (exec-target.ts, vm-agent.c), which a process left
 * by an earlier command cannot reach into.
 * What does carry over is the state itself, by design: whatever an earlier command defined
 * (functions, traps, variables) shapes the later ones, so a check whose result matters runs as
 * a plain exec, not in the agent's session.
 */
export class ShellSession {
  readonly id: string;
  readonly shell: string;
  readonly createdAt: Date = new Date();
  commands = 0;
  #busy = false;
  #ended = false;
  #queue: Promise<unknown> = Promise.resolve();
  /** What the last completed command left (undefined before the first: the open request's env and cwd apply). */
  #state: SessionState | undefined;
  #current: SessionShellProcess | undefined;
  /** The next command's shell, started ahead (prepare()). */
  #standby: { proc: SessionStandbyShell; clearEnv: boolean } | undefined;
  /** Shells of answered commands still on their way out (answered from fd 3, before their exit). */
  #exiting = 0;
  /** The exec tag shared by every command of the session, so close() finds their background jobs. */
  readonly tag = randomBytes(6).toString('hex');
  readonly #host: SessionHost;
  readonly #req: OpenSessionRequest;

  /**
   * `hasBash`: whether the sandbox has /bin/bash (the host checked a bad request already).
   * `carried`: a session of a sandbox that moved here (carry()), reopened as it was.
   */
  constructor(host: SessionHost, req: OpenSessionRequest, hasBash: boolean, carried?: EdgeSessionCarry) {
    this.#host = host;
    this.#req = req;
    this.id = carried?.id ?? `ss-${randomBytes(6).toString('hex')}`;
    if (req.shell === 'bash' && !hasBash && !carried) {
      throw new ApiError(
        'INVALID_REQUEST',
        "shell 'bash' was asked for but the sandbox has no /bin/bash; use 'sh', or 'auto' (bash where there is one)",
        {
          field: 'shell',
        },
      );
    }
    const wantBash = req.shell === 'bash' || ((req.shell ?? 'auto') === 'auto' && hasBash);
    this.shell = carried?.shell ?? (wantBash ? '/bin/bash' : '/bin/sh');
    if (carried) {
      this.#state = carried.state;
      this.commands = carried.commands;
      this.createdAt = new Date(carried.createdAt);
    }
  }

  /** What moves with the sandbox (a migration): everything the next command starts from. */
  carry(): EdgeSessionCarry {
    return {
      id: this.id,
      shell: this.shell === '/bin/bash' ? '/bin/bash' : '/bin/sh',
      request: this.#req,
      ...(this.#state ? { state: this.#state } : {}),
      commands: this.commands,
      createdAt: this.createdAt.toISOString(),
    };
  }

  get alive(): boolean {
    return !this.#ended;
  }

  info(): SessionInfo {
    return {
      id: this.id,
      shell: this.shell,
      alive: this.alive,
      busy: this.#busy,
      commands: this.commands,
      createdAt: this.createdAt.toISOString(),
    };
  }

  /**
   * Starts the next command's shell now, where the host can (SessionHost.standby), so the
   * command does not wait for a process to be made: entering the sandbox, the exec and the
   * shell's own start-up are most of a short command's time. It is a fresh process all the same,
   * started after the previous command ended, in a Landlock domain of its own, its environment
   * and cwd restored from the state only when its program comes. Called after open and after
   * each command; a shell already waiting is kept.
   */
  prepare(): void {
    // Not while a command runs (queued ones run first): it prepares again when it ends.
    if (!this.alive || this.#busy || this.#standby || !this.#host.standby) return;
    const start = this.#shellStart();
    const proc = this.#host.standby(this.#argv(), start);
    if (proc) this.#standby = { proc, clearEnv: start.clearEnv };
  }

  /**
   * Ends the shell started ahead, if any (the session closes, the edge stops). Not waited for: in
   * a paused sandbox it goes at the thaw (a frozen task dies only then).
   */
  dropStandby(): void {
    const s = this.#standby;
    this.#standby = undefined;
    s?.proc.retire();
  }

  /** The host pid of the shell started ahead, if one waits: the edge's, not the sandbox's work (a move does not count it). */
  standbyPid(): number | undefined {
    return this.#standby?.proc.hostPid;
  }

  /**
   * Whether a process of the session's is between states a move's look must not catch: the shell
   * started ahead on its way, its pid not yet known, or an answered command's shell not yet gone.
   */
  settling(): boolean {
    const proc = this.#standby?.proc;
    return this.#exiting > 0 || (proc !== undefined && proc.standing && proc.hostPid === undefined);
  }

  #argv(): string[] {
    return [this.shell, ...(this.shell === '/bin/bash' ? ['--noprofile', '--norc'] : []), '-s'];
  }

  /** How the next command's shell starts: the open request's cwd and env until a state was saved. */
  #shellStart(): SessionStandbyStart {
    return {
      cwd: this.#state ? '/' : this.#req.cwd,
      env: this.#req.env,
      // After the first command the environment is the state's (exports and unsets included).
      clearEnv: this.#state !== undefined,
      writablePaths: this.#req.writablePaths,
      tag: this.tag,
      fd3MaxBytes: MAX_STATE_BYTES,
    };
  }

  /** The shell started ahead if it still waits and starts as this command's would; else none (and it is ended). */
  #takeStandby(clearEnv: boolean): SessionStandbyShell | undefined {
    const s = this.#standby;
    this.#standby = undefined;
    if (!s) return undefined;
    if (s.proc.standing && s.clearEnv === clearEnv) return s.proc;
    s.proc.retire();
    return undefined;
  }

  /** Runs one command in the session; concurrent calls queue in order. */
  exec(req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    const received = performance.now();
    const run = this.#queue.then(() => this.#run(req, signal, received));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #run(req: SessionExecRequest, signal: AbortSignal | undefined, received: number): Promise<ExecResult & { sessionAlive: boolean }> {
    if (!this.alive) throw new SessionClosedError(this.id);
    rejectNul('cmd', [req.cmd]);
    this.#busy = true;
    this.commands++;
    const started = performance.now();
    const nonce = randomBytes(12).toString('hex');
    const marker = `__DSEC_END_${nonce}`;
    const stateEnd = `__DSEC_STATE_${nonce}`;
    const cap = req.maxOutputBytes ?? 1 << 20;
    const stdout = new MarkerScanner(Buffer.from(`\n${marker}\n`), cap);
    const stderr = new MarkerScanner(Buffer.from(`\n${marker}\n`), cap);
    const bash = this.shell === '/bin/bash';
    const oomBefore = await this.#host.oomKills();
    const program = Buffer.from(
      [restoreScript(bash, this.#state), commandScript(bash, req.cmd), saveScript(bash, marker, stateEnd), ''].join('\n'),
    );
    const timeoutMs = req.timeoutMs ?? 60_000;
    const start = this.#shellStart();
    const standby = this.#takeStandby(start.clearEnv);
    standby?.begin(program, timeoutMs);
    const proc = standby ?? this.#host.startShell(this.#argv(), { ...start, input: program, timeoutMs });
    this.#current = proc;
    const onAbort = (): void => proc.kill();
    signal?.addEventListener('abort', onAbort, { once: true });
    let exit;
    let saved: ReturnType<typeof parseSavedState>;
    try {
      proc.onOutput((stream: StreamName, raw: Buffer) => {
        (stream === 'stdout' ? stdout : stderr).push(raw);
      });
      // The shell writes the command's status and its state on fd 3 and closes it, then prints
      // its markers: with both markers in and fd 3 at its end, the answer is complete. The
      // shell's exit, and its starter's after it, are not waited for (~0.2–0.5 ms of two process
      // exits); a background job holding the pipes open does not delay the answer either. A shell
      // that ends without its markers (`exit`, a fatal error, the timeout) is answered at its end.
      const marked = new Promise<void>((resolve) => {
        const check = (): void => {
          if (stdout.found && stderr.found) resolve();
        };
        check();
        proc.onOutput(check);
      }).then(() => proc.fd3Ended);
      exit = await Promise.race([proc.done, marked.then(() => undefined)]);
      saved = stdout.found ? parseSavedState(proc.fd3!.bytes(), stateEnd) : undefined;
      if (!saved) await proc.exited;
    } finally {
      signal?.removeEventListener('abort', onAbort);
      this.#current = undefined;
      this.#busy = false;
    }
    // Until it is gone, the shell is still the session's (a move waits for it: settling()).
    if (saved && proc.exit === undefined) {
      this.#exiting++;
      void proc.exited.then(() => this.#exiting--);
    }
    const timedOut = exit?.timedOut ?? proc.exit?.timedOut ?? false;
    const killed = exit?.killed ?? proc.exit?.killed ?? false;
    if (!stdout.found) stdout.flush();
    if (!stderr.found) stderr.flush();
    const exitCode = saved?.exitCode ?? (await proc.exited);
    if (saved) this.#state = saved.state;
    else if (!timedOut && !killed) this.#ended = true; // the shell exited (`exit`, a fatal error) before saving
    const encoding = req.encoding ?? 'utf8';
    const oomAfter = await this.#host.oomKills();
    // The next command's shell, off this answer's path (the answer is written first).
    setImmediate(() => this.prepare());
    return {
      exitCode: timedOut ? 137 : exitCode,
      stdout: stdout.output.encode(encoding),
      stderr: stderr.output.encode(encoding),
      encoding,
      truncated: stdout.output.truncated || stderr.output.truncated,
      stdoutBytes: stdout.output.total,
      stderrBytes: stderr.output.total,
      timedOut,
      oomKilled: oomAfter > oomBefore,
      durationMs: Math.round((performance.now() - started) * 100) / 100,
      // Its wait: behind the session's earlier commands, then until its shell was asked for.
      queuedMs: Math.round((proc.spawnedAt - received) * 100) / 100,
      ...processFigures(exit ?? proc.exit ?? proc.figuresNow?.() ?? {}),
      sessionAlive: this.alive,
    };
  }

  async close(): Promise<void> {
    this.#ended = true;
    this.dropStandby();
    const current = this.#current;
    if (current) {
      current.kill({ now: true });
      await current.done;
    }
    // Jobs the session put in the background go with it: they carry the session's exec tag.
    await this.#host.endTagged(this.tag);
  }
}

/**
 * The command itself, with stdin at EOF (so it cannot read the rest of the program) and without
 * fd 3 (so its jobs do not hold the state pipe).
 *
 * sh (dash, busybox ash) exits on a syntax error inside a plain eval, and on an error of a special
 * builtin in it (`readonly R=1; R=2`, `shift 5`, `set -o bogus`): the state would not be saved and
 * the session would end. `command eval` is eval without those special properties (POSIX), so
 * such an error fails the command (status 2, the shell's message on stderr) and the session goes
 * on, as bash's `eval` does. Like bash, and like any shell script, the lines before a syntax error
 * have run. (It replaced a syntax check that started `/bin/sh -n -c` for every command.)
 */
function commandScript(bash: boolean, cmd: string): string {
  return `${bash ? 'builtin' : 'command'} eval ${shellQuote(cmd)} </dev/null 3>&-`;
}

export class SessionClosedError extends Error {
  override readonly name = 'SessionClosedError';
  constructor(
    readonly sessionId: string,
    why = 'its shell exited',
  ) {
    super(`session ${sessionId} has ended (${why})`);
  }
}
