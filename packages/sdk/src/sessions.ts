import type { ExecResult, OpenSessionRequest, SessionExecRequest, SessionInfo } from './schema/index.js';
import type { CallOptions, Connection } from './connection.js';
import { CommandExitError } from './errors.js';

export type SessionResult = ExecResult & { sessionAlive: boolean };

/** A persistent shell: `cd`, `export` and shell variables carry over between commands. */
export class Session {
  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
    public info: SessionInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  /**
   * Runs one command in the session and returns its own output and exit code.
   * @example await s.run('cd /tmp && export X=1'); (await s.run('echo $PWD $X')).stdout === '/tmp 1\n'
   */
  /** `timeoutMs` interrupts the command (the session survives); `requestTimeoutMs` bounds the HTTP call. */
  async run(
    cmd: string,
    opts: Omit<SessionExecRequest, 'cmd'> & { signal?: AbortSignal; requestTimeoutMs?: number; throwOnError?: boolean } = {},
  ): Promise<SessionResult> {
    const { signal, requestTimeoutMs, throwOnError, ...rest } = opts;
    const body: SessionExecRequest = { cmd, ...rest };
    const r = await this.conn.json<SessionResult>('POST', `/v1/sandboxes/${this.sandboxId}/sessions/${this.info.id}/exec`, {
      json: body,
      signal,
      timeoutMs: requestTimeoutMs ?? (body.timeoutMs ?? 60_000) + 10_000,
    });
    if (throwOnError && r.exitCode !== 0) throw new CommandExitError(r.exitCode, r.stdout, r.stderr);
    return r;
  }

  async close(opts: CallOptions = {}): Promise<void> {
    await this.conn.json<void>('DELETE', `/v1/sandboxes/${this.sandboxId}/sessions/${this.info.id}`, opts);
  }
}

export class Sessions {
  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
  ) {}

  /** Opens a shell session (bash if the image has it, else sh). */
  async create(opts: OpenSessionRequest & CallOptions = {}): Promise<Session> {
    const { signal, timeoutMs, ...body } = opts;
    const info = await this.conn.json<SessionInfo>('POST', `/v1/sandboxes/${this.sandboxId}/sessions`, { json: body, signal, timeoutMs });
    return new Session(this.conn, this.sandboxId, info);
  }

  async list(opts: CallOptions = {}): Promise<Session[]> {
    const res = await this.conn.json<{ sessions: SessionInfo[] }>('GET', `/v1/sandboxes/${this.sandboxId}/sessions`, opts);
    return res.sessions.map((s) => new Session(this.conn, this.sandboxId, s));
  }
}
