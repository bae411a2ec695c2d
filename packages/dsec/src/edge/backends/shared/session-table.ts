import type { EdgeSessionCarry } from '../../protocol/schemas.js';
import type { ExecResult, SessionExecRequest, SessionInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { EndedSession, restartReason, type ExecJournal, type NotedSession } from './exec-journal.js';
import { MAX_SESSIONS, SessionClosedError, ShellSession } from './shell-session.js';

/**
 * How long after a command its session's new command count may wait to be noted. The count is all
 * a command changes in the journal, and only a restarted edge reads it (to report the session as
 * ended); a note is a file written and renamed over the old one, 0.3–0.9 ms at p50 and 5–10 ms
 * at p99 on the 2-core bench host with other work on its disk (ext4 flushes a file renamed over
 * another), and on the answer's path that was a tenth to a quarter of a session command. So it is
 * noted once per this delay at most, after the answer: a restarted edge may report a count a
 * second short.
 */
export const SESSION_COUNT_NOTE_DELAY_MS = 1000;

/**
 * The shell sessions of one sandbox, whatever runs their commands (crun exec in a container, the
 * guest agent in a VM): the open ones, and those an edge restart ended (listed until closed). Each
 * change is noted in the sandbox's exec journal, so a restarted edge reports every session it
 * did not keep as ended instead of forgetting it.
 */
export class SessionTable {
  readonly #sessions = new Map<string, ShellSession | EndedSession>();
  /** Sessions whose command count is due to be noted (#noteSoon), by id. */
  readonly #countNotes = new Map<string, NodeJS.Timeout>();

  constructor(
    private readonly sandboxId: string,
    private readonly journal: ExecJournal,
  ) {}

  /** Refuses a session past MAX_SESSIONS open ones: called before a new one is made. */
  checkRoom(): void {
    if ([...this.#sessions.values()].filter((s) => s.alive).length >= MAX_SESSIONS) {
      throw new ApiError('CAPACITY_EXCEEDED', `sandbox ${this.sandboxId} already has ${MAX_SESSIONS} sessions; close one first`, {
        max: MAX_SESSIONS,
      });
    }
  }

  add(s: ShellSession): SessionInfo {
    this.checkRoom();
    this.#sessions.set(s.id, s);
    this.#note(s);
    // Its first command's shell, started ahead, after the open's answer.
    setImmediate(() => s.prepare());
    return s.info();
  }

  /**
   * Ends the shells started ahead for the sessions' next commands (ShellSession.prepare): when the
   * edge stops (its sandboxes live on, and nothing of its own may wait in them). A later command
   * starts its shell itself.
   */
  dropStandbys(): void {
    for (const s of this.#sessions.values()) if (s instanceof ShellSession) s.dropStandby();
  }

  /** Whether a session's process is starting or ending where a move's look would count it (ShellSession.settling). */
  settling(): boolean {
    return [...this.#sessions.values()].some((s) => s instanceof ShellSession && s.settling());
  }

  /** The host pids of the shells started ahead (a move's look at the sandbox's processes leaves them out). */
  standbyPids(): number[] {
    return [...this.#sessions.values()].flatMap((s) => (s instanceof ShellSession ? (s.standbyPid() ?? []) : []));
  }

  /**
   * The sessions the journal holds from an edge process that ended: each is listed as ended,
   * with the reason, after `killJobs` has ended what its commands left running (by its tag).
   */
  async endNotedByOldEdge(killJobs: (tag: string) => void | Promise<void>): Promise<void> {
    const at = new Date();
    for (const n of this.journal.read()) {
      if (n.kind !== 'session') continue;
      await killJobs(n.tag);
      this.#sessions.set(n.id, new EndedSession(n, restartReason('session', at)));
    }
  }

  /** The open sessions as they move with the sandbox (ShellSession.carry). */
  carried(): EdgeSessionCarry[] {
    return [...this.#sessions.values()].filter((s): s is ShellSession => s instanceof ShellSession && s.alive).map((s) => s.carry());
  }

  list(): SessionInfo[] {
    return [...this.#sessions.values()].map((s) => s.info());
  }

  async exec(sid: string, req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    const s = this.#get(sid);
    if (s instanceof EndedSession)
      throw new ApiError('SESSION_CLOSED', `session ${sid} has ${s.endReason}; open a new session`, { sessionId: sid });
    try {
      return await s.exec(req, signal);
    } catch (err) {
      if (err instanceof SessionClosedError) throw new ApiError('SESSION_CLOSED', `${err.message}; open a new session`, { sessionId: sid });
      throw err;
    } finally {
      this.#noteSoon(s);
    }
  }

  async close(sid: string): Promise<void> {
    const s = this.#get(sid);
    this.#sessions.delete(sid);
    clearTimeout(this.#countNotes.get(sid));
    this.#countNotes.delete(sid);
    this.journal.forget(sid);
    await s.close();
  }

  /** Ends every session (the sandbox is going): their commands and jobs are killed. */
  closeAll(): void {
    for (const t of this.#countNotes.values()) clearTimeout(t);
    this.#countNotes.clear();
    for (const s of this.#sessions.values()) void s.close();
  }

  /**
   * The edge is stopping (its sandboxes live on): the counts not yet noted are noted now, and no
   * timer is left to write into a journal a restarted edge may have removed with its sandbox.
   */
  flushNotes(): void {
    for (const [sid, timer] of this.#countNotes) {
      clearTimeout(timer);
      const s = this.#sessions.get(sid);
      if (s instanceof ShellSession) this.#note(s);
    }
    this.#countNotes.clear();
  }

  #get(sid: string): ShellSession | EndedSession {
    const s = this.#sessions.get(sid);
    if (!s) throw new ApiError('SESSION_NOT_FOUND', `no session ${sid} in sandbox ${this.sandboxId}`, { sessionId: sid });
    return s;
  }

  /**
   * Notes the session's command count once SESSION_COUNT_NOTE_DELAY_MS has passed, off the
   * answer's path (one note for every command of that spell). The count is what a restarted edge
   * reports; a session closed meanwhile stays forgotten.
   */
  #noteSoon(s: ShellSession): void {
    if (this.#countNotes.has(s.id)) return;
    const timer = setTimeout(() => {
      this.#countNotes.delete(s.id);
      if (this.#sessions.get(s.id) === s) this.#note(s);
    }, SESSION_COUNT_NOTE_DELAY_MS);
    timer.unref();
    this.#countNotes.set(s.id, timer);
  }

  #note(s: ShellSession): void {
    const noted: NotedSession = {
      kind: 'session',
      id: s.id,
      shell: s.shell,
      createdAt: s.createdAt.toISOString(),
      commands: s.commands,
      tag: s.tag,
    };
    this.journal.note(noted);
  }
}
