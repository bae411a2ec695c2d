import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { SessionInfo, StartProcessRequest } from '@dsec/sdk/schema';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import { CappedOutput } from './capped-output.js';
import type { ProcessExit } from './command-process.js';

/** A background process as noted on disk: enough to report it, and to find what is left of it. */
export interface NotedProcess {
  kind: 'process';
  id: string;
  cmd: StartProcessRequest['cmd'];
  startedAt: string;
  /** Its exec tag (see killTagged); absent for a VM guest's process. */
  tag?: string;
  /** Set once it exited while the edge watched. */
  exit?: ProcessExit & { stdoutBytes: number; stderrBytes: number; endReason?: string };
}

/** A shell session as noted on disk. */
export interface NotedSession {
  kind: 'session';
  id: string;
  shell: string;
  createdAt: string;
  commands: number;
  /** The exec tag its commands share: their background jobs carry it. */
  tag: string;
}

export type Noted = NotedProcess | NotedSession;

/**
 * The sessions and background processes of one sandbox, noted in the edge's scratch dir of that
 * sandbox (never inside the sandbox) while they exist. Their state lives in the edge process (a
 * session's cwd and variables, a process's output pipes), so neither survives an edge restart;
 * the journal lets the restarted edge report each one as ended, with the reason, instead of
 * forgetting it, and kill what is left of it in the sandbox.
 */
export class ExecJournal {
  #closed = false;

  constructor(readonly dir: string) {}

  /**
   * No more notes: the sandbox is being torn down. A process killed by the teardown notes its exit
   * as it ends, and that write (mkdir of the journal's dir, a rename into it) landing while the
   * sandbox's dir is removed made the removal fail ("Directory not empty": SANDBOX_KILL_FAILED)
   * or brought the dir back after it.
   */
  close(): void {
    this.#closed = true;
  }

  note(entry: Noted): void {
    if (this.#closed) return;
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    writeFileAtomic(join(this.dir, `${entry.id}.json`), JSON.stringify(entry), 0o600);
  }

  forget(id: string): void {
    rmSync(join(this.dir, `${id}.json`), { force: true });
  }

  /** Every entry that parses (one cut short by a crash mid-write cannot exist: writes are renames). */
  read(): Noted[] {
    let names: string[];
    try {
      names = readdirSync(this.dir).filter((n) => n.endsWith('.json'));
    } catch {
      return [];
    }
    const out: Noted[] = [];
    for (const n of names) {
      try {
        out.push(JSON.parse(readFileSync(join(this.dir, n), 'utf8')) as Noted);
      } catch {
        // removed meanwhile
      }
    }
    return out;
  }
}

/**
 * A background process that ended while no edge watched it (or before the edge restarted), as
 * the process table reports it: its exit and byte counts, no output (the output was kept in the
 * memory of the edge process that ended, so `truncated` is true when there was any).
 */
export class EndedProcess {
  readonly stdout: CappedOutput;
  readonly stderr: CappedOutput;
  readonly done: Promise<ProcessExit>;
  readonly startedAt: Date;
  readonly exit: ProcessExit;
  readonly endReason: string | undefined;

  constructor(noted: NotedProcess & { exit: NonNullable<NotedProcess['exit']> }) {
    this.startedAt = new Date(noted.startedAt);
    const { stdoutBytes, stderrBytes, endReason, ...exit } = noted.exit;
    this.exit = exit;
    this.endReason = endReason;
    this.done = Promise.resolve(exit);
    this.stdout = new CappedOutput(0);
    this.stdout.total = stdoutBytes;
    this.stderr = new CappedOutput(0);
    this.stderr.total = stderrBytes;
  }

  onOutput(): () => void {
    return () => undefined;
  }
  writeStdin(): boolean {
    return false;
  }
  endStdin(): void {}
  pause(): void {}
  resume(): void {}
  async signal(): Promise<void> {}
  kill(): void {}
}

/** A session whose shell state was lost with the edge process that held it. */
export class EndedSession {
  readonly id: string;
  readonly alive = false;

  constructor(
    private readonly noted: NotedSession,
    readonly endReason: string,
  ) {
    this.id = noted.id;
  }

  info(): SessionInfo {
    return {
      id: this.id,
      shell: this.noted.shell,
      alive: false,
      busy: false,
      commands: this.noted.commands,
      createdAt: this.noted.createdAt,
      endReason: this.endReason,
    };
  }

  async close(): Promise<void> {}
}

/** Why a restarted edge reports a session or process as ended. */
export function restartReason(what: 'session' | 'process', at: Date): string {
  return what === 'session'
    ? `ended when the edge restarted (${at.toISOString()}): a session's shell state lives in the edge process, which ended; the restarted edge killed the jobs the session had left running`
    : `ended when the edge restarted (${at.toISOString()}): a background process's output pipes are held by the edge process, which ended; the restarted edge killed what was left of it`;
}
