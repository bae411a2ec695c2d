import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { ApiError } from '../../../../api-error.js';
import { signalNumber } from '../../../../host/run-tool.js';
import { readPidFile } from '../crun.js';
import { CGROUP_PARENT, cgroupPids } from '../../../../host/cgroups.js';
import { LANDLOCK_PATH, processBlock, type ProcessSpec } from '../oci-config.js';
import { SANDBOX_OOM_SCORE_ADJ } from '../../../../host/node-memory.js';
import { CommandCgroup } from '../../../../host/command-cgroups.js';
import { memoryPeaks } from '../../../../host/memory-peaks.js';
import { killTree } from '../../../../host/process-tree.js';
import { CappedOutput } from '../../shared/capped-output.js';
import { PLAN_DATA_MAX, type HelperChild } from '../../../../host/helper-child.js';
import { startCrunExec, writeFileFd, type ExecChild } from './crun-exec-child.js';
import { commandPid, standbySpec, startEnter } from './enter-child.js';
import type { ExecTarget } from './exec-target.js';
import {
  processFigures,
  type CommandProcess,
  type OutputListener,
  type ProcessExit,
  type ProcessFigures,
  type StartOptions,
  type StreamName,
} from '../../shared/command-process.js';

/** After the command exits, how long the pipes may stay silent before they are closed. */
const QUIET_MS = 500;

/**
 * How long a signal waits for a just-started command's pid (normally milliseconds: dsec-spawn's
 * fork and the starter's); well inside the control plane's 30 s call timeout, so a remote caller
 * is told why rather than that its edge did not answer.
 */
const SIGNAL_PID_WAIT_MS = 10_000;

/** Environment variable that marks every process a command started (see killTagged). */
export const EXEC_TAG_VAR = 'DSEC_EXEC_ID';

/** The name of the command cgroup of the commands that share `tag` (see command-cgroups.ts). */
export function commandCgroupName(tag: string): string {
  return `cmd-${tag}`;
}

/**
 * One command cgroup made ahead per sandbox, after a command has finished, for its next one
 * (with its tag): a cgroup's mkdir is ~0.08 ms that the next command's start then does not wait
 * for. A spare that no command takes goes with the sandbox's cgroup tree at its teardown.
 */
const spareCgroups = new Map<string, { tag: string; cgroup: CommandCgroup }>();

function makeSpareCgroup(sandboxId: string): void {
  if (spareCgroups.has(sandboxId)) return;
  const tag = randomBytes(6).toString('hex');
  const cgroup = CommandCgroup.open(sandboxId, commandCgroupName(tag));
  if (cgroup) spareCgroups.set(sandboxId, { tag, cgroup });
}

/** Drops what is kept of a sandbox's spare command cgroup (its directory goes with the sandbox's cgroups). */
export function forgetSpareCgroup(sandboxId: string): void {
  spareCgroups.delete(sandboxId);
}

/**
 * SIGKILLs every process of the commands that share `tag`: their command cgroup at once, and any
 * process whose environment carries the tag (commands started before the cgroup existed, or on
 * a host without cgroup.kill).
 */
export function killTagged(sandboxId: string, tag: string): number {
  const cgroup = CommandCgroup.open(sandboxId, commandCgroupName(tag), { create: false });
  cgroup?.kill();
  cgroup?.remove();
  const needle = Buffer.from(`${EXEC_TAG_VAR}=${tag}\0`);
  let killed = 0;
  for (const pid of cgroupPids(`${CGROUP_PARENT}/${sandboxId}`)) {
    try {
      if (!readFileSync(`/proc/${pid}/environ`).includes(needle)) continue;
      process.kill(pid, 'SIGKILL');
      killed++;
    } catch {
      // exited meanwhile
    }
  }
  return killed;
}
/**
 * One process started in a sandbox from outside by the edge's dsec-spawn (enter-child.ts), or by
 * `crun exec` where that cannot (crun-exec-child.ts): its output (capped), stdin, timeout and
 * kill. The process spec (argv, env, cwd, user) is given whole (in dsec-spawn's pipe, or a file of
 * the edge's for crun) so nothing is inherited by accident. kill() ends the process's whole tree,
 * found from the host through /proc starting at the pid its starter reports; the sandbox itself
 * is untouched.
 *
 * One file for one concept, a command's life on the host side: its start, output, stdin, timeout,
 * signals and kill share its state (its pid, its exit, its command cgroup). How it is started is
 * elsewhere (enter-child.ts, crun-exec-child.ts, exec-standby.ts); the helpers above it are the
 * pieces of kill() that stand alone.
 */
export class SandboxProcess implements CommandProcess {
  // Set again by beginCommand() (a standby's cap is its command's): nothing is written before.
  stdout: CappedOutput;
  stderr: CappedOutput;
  readonly done: Promise<ProcessExit>;
  /** The starter's own exit (the command's status), before its pipes have drained. */
  readonly exited: Promise<number>;
  readonly fd3: CappedOutput | undefined;
  /**
   * Resolves once fd 3 has reached end of file (or was never asked for): the three pipes are
   * read independently, so markers seen on stdout and stderr say nothing about whether fd 3's
   * bytes, written before them, have been read yet.
   */
  readonly fd3Ended: Promise<void>;
  readonly startedAt = new Date();
  /** performance.now() when its first process was asked for (a standby's: when begin() gave it its input): the end of the command's wait. */
  spawnedAt: number;
  #exit: ProcessExit | undefined;
  readonly #child: ExecChild;
  /** The command's host pid once known: crun's pid file, or the child of dsec-spawn's starter. */
  #commandPid: () => number | undefined = () => undefined;
  readonly #listeners = new Set<OutputListener>();
  #timedOut = false;
  #killed = false;
  readonly #tag: string;
  readonly #sandboxId: string;
  readonly #cgroup: CommandCgroup | undefined;
  #figures: (end: boolean) => ProcessFigures = () => ({});
  #timer: NodeJS.Timeout | undefined;
  /** performance.now() at the command's start (a standby's: at begin()), for its duration. */
  #started: number;
  readonly #target: ExecTarget;
  /** Started as a standby (`standby`), not yet begun. */
  #waiting: boolean;
  readonly #standby: 'input' | 'command' | undefined;
  readonly #user: ProcessSpec['user'];

  /**
   * `standby`: start the process now, but as a command only from begin() or beginCommand(), which
   * start its timeout, duration and figures. 'input': its stdin is a pipe that begin() fills with
   * its whole input (a session's next shell, started ahead: shell-session.ts). 'command': set up
   * by dsec-spawn as far as the exec, it waits for the command itself, which beginCommand() sends
   * (an exec's process made ahead: exec-standby.ts); only where dsec-spawn starts commands.
   */
  constructor(target: ExecTarget, spec: ProcessSpec, opts: StartOptions & { standby?: 'input' | 'command' }) {
    // A command with a Landlock domain (every one with writablePaths, and every one where the
    // kernel has Landlock ABI 2) starts in its own command cgroup, so that kill() reaches
    // everything it starts (command-cgroups.ts): one made ahead when there is one (a command of
    // its own, not a session's shared one).
    const ownCgroup = spec.args[0] === LANDLOCK_PATH;
    const spare = ownCgroup && opts.tag === undefined ? spareCgroups.get(target.id) : undefined;
    if (spare) spareCgroups.delete(target.id);
    const tag = opts.tag ?? spare?.tag ?? randomBytes(6).toString('hex');
    // The tag is inherited by everything the command starts, so kill() finds descendants that
    // were reparented to the sandbox's init (a double fork) and left the process tree.
    this.#tag = tag;
    this.#sandboxId = target.id;
    this.#cgroup = ownCgroup ? (spare?.cgroup ?? CommandCgroup.open(target.id, commandCgroupName(tag))) : undefined;
    const fd3 = opts.fd3MaxBytes !== undefined;
    const env = [...spec.env, `${EXEC_TAG_VAR}=${tag}`];
    this.stdout = new CappedOutput(opts.maxOutputBytes);
    this.stderr = new CappedOutput(opts.maxOutputBytes);
    this.#target = target;
    this.#waiting = opts.standby !== undefined;
    this.#standby = opts.standby;
    this.#user = spec.user;
    this.#started = performance.now();
    this.spawnedAt = this.#started;
    const withStdin = opts.stdin || opts.input !== undefined || this.#waiting;
    const io = { stdin: withStdin, fd3, oomScoreAdj: SANDBOX_OOM_SCORE_ADJ };
    const spawner = target.crun.spawner;
    let specFile: string | undefined;
    let pidFile: string | undefined;
    let child: ExecChild;
    if (target.enter && spawner) {
      // dsec-spawn starts it (enter-child.ts): the starter moves it into its command cgroup and
      // applies its Landlock domain itself, the argv and environment sent in the helper's pipe.
      // A stdin known whole at the start (a session command's program, an exec's `stdin`) is in
      // its pipe before the command runs: the command does not wait for the edge to open the
      // pipe after the helper's `started` and write it.
      const upFront = opts.input !== undefined && !opts.stdin && opts.input.length <= PLAN_DATA_MAX ? opts.input : undefined;
      child = startEnter(spawner, {
        ...io,
        stdinData: upFront,
        sandboxId: target.id,
        enter: target.enter,
        process: { ...spec, env },
        commandCgroup: this.#cgroup?.dir,
        standby: opts.standby === 'command',
      });
      this.#commandPid = () => commandPid((child as HelperChild).pid);
    } else if (opts.standby === 'command') {
      throw new Error("a command standby needs dsec-spawn and the sandbox's enter target");
    } else {
      // crun exec starts dsec-landlock, which first moves itself into its command cgroup through
      // that cgroup's cgroup.procs, opened here and handed in as an fd (landlock-exec.c).
      const args = this.#cgroup
        ? [LANDLOCK_PATH, '--cgroup-fd', String(writeFileFd({ fd3 })), this.#cgroup.name, ...spec.args.slice(1)]
        : spec.args;
      // crun's spec and pid files are this process's own, even when commands share a tag (a
      // session's): the next session command starts as soon as this one's markers are in, before
      // this one has finished, and a shared pid file handed it this command's pid, dead by then.
      const fileId = randomBytes(6).toString('hex');
      specFile = join(target.scratchDir, `exec-${fileId}.spec`);
      pidFile = join(target.scratchDir, `exec-${fileId}.pid`);
      const crunPidFile = pidFile;
      this.#commandPid = () => readPidFile(crunPidFile);
      writeFileSync(specFile, JSON.stringify(processBlock({ ...spec, args, env })), { mode: 0o600 });
      child = startCrunExec(spawner, {
        ...io,
        writeFile: this.#cgroup?.procsFile,
        globalArgs: target.crun.globalArgs(),
        execArgs: ['--process', specFile, '--pid-file', pidFile, target.id],
      });
    }
    // Read once its starter is asked for (a throw before leaves no memory window open) and before
    // the command's first process runs (crun exec or the starter has its own work first).
    if (!this.#waiting) this.#openFigures(this.#cgroup !== undefined && !this.#cgroup.fresh);
    const fd3Stream = fd3 ? (child.stdio[3] as Readable) : undefined;
    this.fd3 = fd3 ? new CappedOutput(opts.fd3MaxBytes!) : undefined;
    fd3Stream?.on('data', (d: Buffer) => {
      this.fd3!.push(d);
      opts.onFd3?.(d);
    });
    this.fd3Ended = fd3Stream
      ? new Promise<void>((resolve) => {
          fd3Stream.once('end', resolve);
          fd3Stream.once('close', resolve);
        })
      : Promise.resolve();
    this.#child = child;
    child.stdin?.on('error', () => {}); // the command may exit without reading its stdin
    // A command standby may be gone before its spec is written (killed by what runs in the
    // sandbox, its sandbox ending): the write's EPIPE is that exit's, reported through it.
    if (opts.standby === 'command') (child.stdio[child.stdio.length - 1] as Writable).on('error', () => {});
    if (this.#waiting) {
      // begin() writes it
    } else if (opts.input !== undefined && !opts.stdin) child.stdin?.end(opts.input);
    else if (opts.input !== undefined) child.stdin?.write(opts.input);
    child.stdout!.on('data', (d: Buffer) => this.#emit('stdout', d, this.stdout.push(d)));
    child.stderr!.on('data', (d: Buffer) => this.#emit('stderr', d, this.stderr.push(d)));
    if (!this.#waiting) this.#armTimeout(opts.timeoutMs);
    this.exited = new Promise<number>((resolve) => {
      child.on('error', () => resolve(127));
      child.on('exit', (c, s) => resolve(c ?? 128 + signalNumber(s)));
    });
    this.done = new Promise<ProcessExit>((resolve) => {
      let code: number | undefined;
      const finish = (): void => {
        if (this.#exit) return;
        if (this.#timer) clearTimeout(this.#timer);
        // Cleaned up off the answer's path (the caller gets the result first); the sandbox's
        // teardown removes whatever is left if it comes sooner.
        const cgroup = this.#cgroup;
        setImmediate(() => {
          try {
            if (specFile !== undefined) rmSync(specFile, { force: true });
            if (pidFile !== undefined) rmSync(pidFile, { force: true });
          } catch {
            // the sandbox's directory is going (a teardown under way)
          }
          // A shared tag's cgroup belongs to whoever shares it (a session removes it at close,
          // killTagged): removed here, it could vanish under the next command before its move.
          if (opts.tag === undefined && cgroup) {
            cgroup.remove();
            makeSpareCgroup(target.id);
          }
        });
        this.#exit = {
          exitCode: this.#timedOut ? 137 : (code ?? 1),
          timedOut: this.#timedOut,
          killed: this.#killed,
          durationMs: Math.round((performance.now() - this.#started) * 100) / 100,
        };
        Object.assign(this.#exit, this.#figures(true));
        resolve(this.#exit);
      };
      child.on('error', (err) => {
        // crun exec lost its starter (dsec-spawn died) after it may have started the command:
        // the command must not run on where nothing waits for it.
        const pid = this.hostPid;
        if (pid) killTree(pid);
        if (opts.tag === undefined) this.#cgroup?.kill();
        const msg = Buffer.from(`crun exec failed: ${err.message}\n`);
        this.#emit('stderr', msg, this.stderr.push(msg));
        code = 127;
        finish();
      });
      child.on('exit', (c, s) => {
        code = c ?? 128 + signalNumber(s);
        // The pipes normally close right after; a background child of the command may hold them
        // open for good. Wait while output keeps coming (a busy host delivers it late), and stop
        // waiting only after a quiet spell.
        //
        // A quiet spell is only over once the pipes have been polled after it: timers run before
        // a loop turn's I/O, so on a loop that stalled (a busy host, synchronous work) the timer
        // would fire while the command's last output, and the pipes' end, wait unread — and the
        // answer was exit 0 with the output lost (1 exec in ~200 with 8 at a time on a loaded
        // machine; most often seen as the first command after a resume). The check runs in
        // setImmediate, after this turn's poll has read what is waiting.
        let chunks = 0;
        let grace = setTimeout(quietSpellOver, QUIET_MS);
        function quietSpellOver(): void {
          const seen = chunks;
          setImmediate(() => {
            if (chunks === seen) stopWaiting();
          });
        }
        function stopWaiting(): void {
          child.stdout!.destroy();
          child.stderr!.destroy();
          fd3Stream?.destroy();
          finish();
        }
        const rearm = (): void => {
          chunks++;
          clearTimeout(grace);
          grace = setTimeout(quietSpellOver, QUIET_MS);
        };
        child.stdout!.on('data', rearm);
        child.stderr!.on('data', rearm);
        fd3Stream?.on('data', rearm);
        child.on('close', () => {
          clearTimeout(grace);
          finish();
        });
      });
    });
  }

  get exit(): ProcessExit | undefined {
    return this.#exit;
  }

  /**
   * A standby's start as a command: its whole input on stdin (then closed), and from now its
   * timeout, its duration, and the CPU and memory figures of its answer. Once only.
   */
  begin(input: Buffer, timeoutMs: number | undefined): void {
    if (!this.#waiting || this.#standby !== 'input') throw new Error('begin() is for an input standby, once');
    this.#go(timeoutMs, () => this.#child.stdin?.end(input));
  }

  /** Whether beginCommand() can make this standby run `spec`: the user it was set up as is the spec's. */
  fits(spec: ProcessSpec): boolean {
    return this.#standby === 'command' && spec.user.uid === this.#user.uid && spec.user.gid === this.#user.gid;
  }

  /**
   * A command standby's start as `spec`'s command (its Landlock flags stripped: the standby is in
   * its domain already, and fits() said the user is the same): its cwd, argv and environment on
   * its spec pipe, its stdin (`input`, else an empty pipe at its end), its output cap. Once only.
   */
  beginCommand(
    spec: ProcessSpec,
    args: string[],
    opts: { input?: Buffer | undefined; maxOutputBytes: number; timeoutMs?: number | undefined },
  ): void {
    if (!this.#waiting || this.#standby !== 'command') throw new Error('beginCommand() is for a command standby, once');
    this.stdout = new CappedOutput(opts.maxOutputBytes);
    this.stderr = new CappedOutput(opts.maxOutputBytes);
    const specPipe = this.#child.stdio[this.#child.stdio.length - 1] as Writable;
    this.#go(opts.timeoutMs, () => {
      specPipe.end(standbySpec(spec.cwd, args, [...spec.env, `${EXEC_TAG_VAR}=${this.#tag}`]));
      this.#child.stdin?.end(opts.input);
    });
  }

  /** A standby becomes its command: `send` gives it what it waits for; its clocks start now. */
  #go(timeoutMs: number | undefined, send: () => void): void {
    this.#waiting = false;
    this.#started = performance.now();
    this.spawnedAt = this.#started;
    send();
    // Its cgroup has run the standby's start-up already (and, a session's, earlier commands): the
    // command's CPU is what it adds from here. Read after the command is on its way (three cgroup
    // files, ~0.3 ms on the bench host, the command meanwhile starting on another CPU): what it
    // runs before the read is not counted, tens of microseconds at most.
    this.#openFigures(this.#cgroup !== undefined);
    this.#armTimeout(timeoutMs);
  }

  /**
   * Ends a standby not yet begun: its own process only (SIGKILL to its pid), never what shares
   * its tag (a session's jobs: kill() would end those too). Before its pid is known, its stdin's
   * end does it: the shell reads an empty program and exits.
   */
  retire(): void {
    if (!this.#waiting) return;
    this.#waiting = false;
    // A command standby reads its spec pipe's end with nothing on it and exits (status 0).
    if (this.#standby === 'command') (this.#child.stdio[this.#child.stdio.length - 1] as Writable | null)?.end();
    const pid = this.hostPid;
    if (pid) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    this.#child.stdin?.end();
  }

  /** Whether this standby still waits for begin() with its process alive. */
  get standing(): boolean {
    return this.#waiting && this.#exit === undefined && this.#child.exitCode === null && this.#child.signalCode === null;
  }

  /**
   * The CPU and memory figures from now. `cpuSoFar`: the cgroup has run something already (a
   * session's shared one, a standby's start-up), so the command's CPU is the difference; a
   * cgroup this command made has run nothing yet: 0, without a read of its cpu.stat.
   */
  #openFigures(cpuSoFar: boolean): void {
    const cpuBefore = cpuSoFar ? (this.#cgroup?.cpuUsec() ?? 0) : 0;
    const memory = memoryPeaks.open(this.#target.id);
    this.#figures = (end) => {
      const figures: ProcessFigures = {};
      const cpu = this.#cgroup?.cpuUsec();
      if (cpu !== undefined) figures.cpuMs = Math.round((cpu - cpuBefore) / 10) / 100;
      const peak = end ? memory?.close() : memory?.peek();
      if (peak !== undefined) figures.peakMemoryBytes = peak;
      return figures;
    };
  }

  #armTimeout(timeoutMs: number | undefined): void {
    if (timeoutMs === undefined || this.#exit) return;
    this.#timer = setTimeout(() => {
      this.#timedOut = true;
      this.kill();
    }, timeoutMs);
  }

  /** The command's pid as the host sees it, once its starter has started it. */
  get hostPid(): number | undefined {
    return this.#commandPid();
  }

  /** Every chunk as it arrives (`raw`), and the part of it within the cap (`kept`, maybe empty). */
  onOutput(listener: OutputListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #emit(stream: StreamName, raw: Buffer, kept: Buffer): void {
    for (const l of this.#listeners) l(stream, raw, kept);
  }

  writeStdin(data: Buffer): boolean {
    const stdin = this.#child.stdin;
    if (!stdin || stdin.writableEnded || this.#exit) return false;
    stdin.write(data);
    return true;
  }

  endStdin(): void {
    this.#child.stdin?.end();
  }

  /** Stops reading output (the command blocks on a full pipe) until resume(): backpressure. */
  pause(): void {
    this.#child.stdout?.pause();
    this.#child.stderr?.pause();
  }

  resume(): void {
    this.#child.stdout?.resume();
    this.#child.stderr?.resume();
  }

  /**
   * Sends a signal to the command (SIGKILL: to its whole process tree). Right after start the pid
   * may not be known yet (the start answers before dsec-spawn has forked the starter, and the
   * starter reports the command's pid once it has forked it): a signal waits for it, or for the
   * command's end, never answering as sent when it was not. A SIGKILL stops waiting after 1 s and
   * kills the command's cgroup, its tagged processes and its starter instead.
   */
  async signal(sig: NodeJS.Signals, opts: { now?: boolean } = {}): Promise<void> {
    if (sig === 'SIGKILL') this.#killed = true;
    let pid = this.hostPid;
    const waitMs = sig === 'SIGKILL' ? 1000 : SIGNAL_PID_WAIT_MS;
    // The starter reaps the command and ends after it: once it has ended there is nothing to
    // signal, even while the output pipes, held by what the command left behind, keep #exit off.
    const starterEnded = (): boolean => this.#child.exitCode !== null || this.#child.signalCode !== null;
    for (const t0 = performance.now(); !pid && !this.#exit && !starterEnded() && performance.now() - t0 < waitMs;) {
      await new Promise((r) => setTimeout(r, 5));
      pid = this.hostPid;
    }
    if (this.#exit) return;
    // A SIGKILL goes on to the command's cgroup and tagged processes: what it left behind.
    if (!pid && starterEnded() && sig !== 'SIGKILL') return;
    if (!pid && sig !== 'SIGKILL')
      throw new ApiError(
        'EXEC_FAILED',
        `the command has not started after ${SIGNAL_PID_WAIT_MS / 1000} s (its starter reported no pid); ${sig} was not sent`,
        { signal: sig },
      );
    if (sig === 'SIGKILL') {
      this.#cgroup?.kill();
      if (pid) killTree(pid);
      killTagged(this.#sandboxId, this.#tag);
      // The starter (dsec-spawn's, crun exec) reaps the command and exits by itself; killing it
      // first could leave the command unreaped a while. Only a starter that lingers is killed.
      if (!pid || opts.now) this.#child.kill('SIGKILL');
      else setTimeout(() => this.#child.kill('SIGKILL'), 1000).unref();
      return;
    }
    if (pid) {
      try {
        process.kill(pid, sig);
      } catch {
        // already gone
      }
    }
  }

  /** Its CPU time and the sandbox's memory peak so far (a session command's answer comes before its shell's end). */
  figuresNow(): ProcessFigures {
    return this.#exit ? processFigures(this.#exit) : this.#figures(false);
  }

  /** `now`: also kill the starter at once (the sandbox is being torn down, its init reaps nothing). */

  kill(opts: { now?: boolean } = {}): void {
    void this.signal('SIGKILL', opts);
  }
}
