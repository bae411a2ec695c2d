import { randomBytes } from 'node:crypto';
import type { Encoding, ProcessInfo, ProcessOutput, StartProcessRequest } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { EndedProcess, restartReason, type ExecJournal } from './exec-journal.js';
import type { CommandProcess } from './command-process.js';
import { OutputBudget, outputReservation } from '../../../output-budget.js';

interface Entry {
  id: string;
  cmd: StartProcessRequest['cmd'];
  proc: CommandProcess;
  /** The output it reserved past the default cap (0 bytes at the default), given back when it is forgotten. */
  reservation?: { bytes: number; release: () => void } | undefined;
}

/** How many finished processes a sandbox remembers (running ones are never dropped). */
const KEEP_EXITED = 64;

/**
 * Output a sandbox's background processes may keep past the default cap, together: two at the
 * largest cap (64 MiB a stream). A process keeps its output in the edge's memory while it runs and
 * after it exits (until one of the KEEP_EXITED), so without it one sandbox's 320 processes at the
 * largest cap could hold 40 GiB.
 */
export const PROCESS_OUTPUT_BUDGET_BYTES = 256 * 2 ** 20;

/**
 * Background processes of one sandbox: started detached from any HTTP request (a web server, a
 * watcher), listed, polled for output, waited on, signalled. They live as long as the sandbox
 * or until they exit.
 */
export class ProcessTable {
  readonly #entries = new Map<string, Entry>();
  readonly #output: OutputBudget;

  /**
   * `sandboxId` names the sandbox in PROCESS_NOT_FOUND errors. With a `journal`, each process is
   * noted on disk while it runs and after it exits (until pruned), so a restarted edge reports it.
   */
  constructor(
    readonly sandboxId: string,
    private readonly journal?: ExecJournal,
  ) {
    this.#output = new OutputBudget(PROCESS_OUTPUT_BUDGET_BYTES, {
      whole: `what sandbox ${sandboxId}'s background processes may keep past the default cap`,
      owner: 'this sandbox',
      otherwise: 'end (or wait for) its processes with large caps',
    });
  }

  /**
   * Reserves a new process's output past the default cap (outputReservation), before it starts.
   * Exited processes' output is forgotten, oldest first, to make room; running ones' never is.
   * Throws OUTPUT_BUDGET_EXCEEDED when their reservations leave no room.
   */
  reserveOutput(maxOutputBytes: number): { bytes: number; release: () => void } {
    const bytes = outputReservation(maxOutputBytes);
    if (!this.#output.fits(this.sandboxId, bytes)) {
      // Forgotten only when that makes room, and only those that hold some: oldest first.
      const holding = [...this.#entries.values()].filter((e) => e.proc.exit && (e.reservation?.bytes ?? 0) > 0);
      const freeable = holding.reduce((n, e) => n + e.reservation!.bytes, 0);
      if (this.#output.heldBytes - freeable + bytes <= this.#output.totalBytes)
        for (const e of holding) {
          if (this.#output.fits(this.sandboxId, bytes)) break;
          this.#forget(e);
        }
    }
    return { bytes, release: this.#output.reserve(this.sandboxId, bytes) };
  }

  /**
   * Tracks a started command (a SandboxProcess in a container, the guest agent's exec in a VM).
   * `tag`: its exec tag; `release`: its reserveOutput, given back when it is forgotten.
   */
  add(
    cmd: StartProcessRequest['cmd'],
    proc: CommandProcess,
    tag?: string,
    reservation?: { bytes: number; release: () => void },
  ): ProcessInfo {
    const entry: Entry = {
      id: `p-${randomBytes(6).toString('hex')}`,
      cmd,
      proc,
      reservation,
    };
    this.#entries.set(entry.id, entry);
    const noted = { kind: 'process' as const, id: entry.id, cmd, startedAt: proc.startedAt.toISOString(), ...(tag ? { tag } : {}) };
    this.journal?.note(noted);
    void proc.done.then((exit) => {
      if (this.#entries.has(entry.id))
        this.journal?.note({ ...noted, exit: { ...exit, stdoutBytes: proc.stdout.total, stderrBytes: proc.stderr.total } });
      this.#prune();
    });
    return this.#info(entry);
  }

  /**
   * After an edge restart: every process the journal has is reported again. One that was still
   * running when the old edge ended has lost its output pipes with it: what is left of it in the
   * sandbox is killed (its exec tag finds its tree: `killTagged`), and it is reported ended with the reason.
   */
  restore(at: Date, killTagged: (tag: string) => void): void {
    for (const n of this.journal?.read() ?? []) {
      if (n.kind !== 'process') continue;
      let exit = n.exit;
      if (!exit) {
        if (n.tag) killTagged(n.tag);
        const durationMs = Math.max(0, at.getTime() - Date.parse(n.startedAt));
        exit = {
          exitCode: 137,
          timedOut: false,
          killed: true,
          durationMs,
          stdoutBytes: 0,
          stderrBytes: 0,
          endReason: restartReason('process', at),
        };
        this.journal?.note({ ...n, exit });
      }
      this.#entries.set(n.id, { id: n.id, cmd: n.cmd, proc: new EndedProcess({ ...n, exit }) });
    }
    this.#prune();
  }

  get(id: string): Entry | undefined {
    return this.#entries.get(id);
  }

  /** The process, or PROCESS_NOT_FOUND: every backend's calls on one process start here. */
  entry(id: string): Entry {
    const e = this.#entries.get(id);
    if (!e) throw new ApiError('PROCESS_NOT_FOUND', `no process ${id} in sandbox ${this.sandboxId}`, { pid: id });
    return e;
  }

  list(): ProcessInfo[] {
    return [...this.#entries.values()].map((e) => this.#info(e));
  }

  info(id: string): ProcessInfo {
    return this.#info(this.entry(id));
  }

  output(id: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): ProcessOutput {
    const e = this.entry(id);
    return {
      process: this.#info(e),
      stdout: e.proc.stdout.since(offsets.stdout).toString(encoding),
      stderr: e.proc.stderr.since(offsets.stderr).toString(encoding),
      encoding,
    };
  }

  async wait(id: string, timeoutMs: number): Promise<ProcessInfo> {
    const e = this.entry(id);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([e.proc.done, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    return this.#info(e);
  }

  /** Kills everything still running (the sandbox is going away). */
  killAll(): void {
    for (const e of this.#entries.values()) e.proc.kill({ now: true });
  }

  #info(e: Entry): ProcessInfo {
    const exit = e.proc.exit;
    const info: ProcessInfo = {
      id: e.id,
      cmd: e.cmd,
      status: exit ? 'exited' : 'running',
      timedOut: exit?.timedOut ?? false,
      startedAt: e.proc.startedAt.toISOString(),
      stdoutBytes: e.proc.stdout.total,
      stderrBytes: e.proc.stderr.total,
      truncated: e.proc.stdout.truncated || e.proc.stderr.truncated,
    };
    if (exit) {
      info.exitCode = exit.exitCode;
      info.durationMs = exit.durationMs;
    }
    if (e.proc instanceof EndedProcess && e.proc.endReason) info.endReason = e.proc.endReason;
    return info;
  }

  #prune(): void {
    const exited = [...this.#entries.values()].filter((e) => e.proc.exit);
    for (const e of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) this.#forget(e);
  }

  #forget(e: Entry): void {
    this.#entries.delete(e.id);
    this.journal?.forget(e.id);
    e.reservation?.release();
  }
}
