import {
  DEFAULT_EXEC_TIMEOUT_MS,
  ExecRequest,
  type ExecResult,
  type ProcessInfo,
  type ProcessOutput,
  type SignalRequest,
  StartProcessRequest,
} from './schema/index.js';
import { type CallOptions, type Connection, abortedError } from './connection.js';
import { CommandExitError, DsecError } from './errors.js';
import { readNdjson } from './ndjson.js';
import { checkBody, checkCmd, checkOptionalInt, checkSignal } from './validate.js';

/**
 * Options of `commands.run` and `commands.stream`, besides the request fields:
 * - `timeoutMs`: the command's own timeout; past it the command's whole process tree is killed
 *   and the result says `timedOut: true`, exit code 137. @default 60000 (60 s)
 * - `maxOutputBytes`: bytes kept per stream; past it bytes are counted, not kept (`truncated`).
 *   @default 1048576 (1 MiB); at most 64 MiB. A stream with `uncapped: true` sends every byte.
 * - `encoding`: `'utf8'` text, or `'base64'` for the exact bytes. @default 'utf8'
 * - `cwd`: absolute working directory. @default the image's
 * The HTTP call waits for the command: `timeoutMs` plus a margin, or `requestTimeoutMs` when given.
 */
export type RunOptions = Omit<ExecRequest, 'cmd'> & {
  /** Aborts the call (and so kills the command); the call then fails with AbortedError, or TimeoutError for AbortSignal.timeout(). */
  signal?: AbortSignal;
  /** Deadline of the HTTP call itself. @default timeoutMs + 10 s (70 s with the default timeoutMs) */
  requestTimeoutMs?: number;
  /** Throw CommandExitError when the exit code is not 0. @default false */
  throwOnError?: boolean;
  /** Called with each stdout chunk as it is produced (switches to streaming). */
  onStdout?: (chunk: Uint8Array) => void;
  onStderr?: (chunk: Uint8Array) => void;
};

export type StreamEvent = { type: 'stdout' | 'stderr'; data: Uint8Array } | ({ type: 'exit' } & Omit<ExecResult, 'stdout' | 'stderr'>);

/** The HTTP call waits for the command: give it a margin over the command's own timeout. */
function callTimeout(req: { timeoutMs?: number | undefined }, requestTimeoutMs: number | undefined): number {
  return requestTimeoutMs ?? (req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS) + 10_000;
}

/** The checks every command call makes before sending anything. */
function checkExec(cmd: unknown, body: unknown, opts: { signal?: unknown; requestTimeoutMs?: unknown }, what: string): void {
  checkCmd(cmd);
  checkSignal(opts.signal);
  checkOptionalInt(opts.requestTimeoutMs, 'requestTimeoutMs', 1);
  checkBody(what === 'commands.start' ? StartProcessRequest : ExecRequest, body, what);
}

/** A background process: poll its output, wait, signal, feed stdin. */
export class ProcessHandle {
  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
    public info: ProcessInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  #path(suffix = ''): string {
    return `/v1/sandboxes/${this.sandboxId}/processes/${this.info.id}${suffix}`;
  }

  /** Output so far, from the given byte offsets of the kept output. */
  async output(
    opts: CallOptions & { stdoutOffset?: number; stderrOffset?: number; encoding?: 'utf8' | 'base64' } = {},
  ): Promise<ProcessOutput> {
    const { stdoutOffset, stderrOffset, encoding, ...call } = opts;
    const out = await this.conn.json<ProcessOutput>('GET', this.#path(), {
      query: { stdoutOffset: stdoutOffset?.toString(), stderrOffset: stderrOffset?.toString(), encoding },
      ...call,
    });
    this.info = out.process;
    return out;
  }

  /** Waits until the process exits or `waitMs` passes; returns its state either way. */
  async wait(opts: CallOptions & { waitMs?: number } = {}): Promise<ProcessInfo> {
    const waitMs = opts.waitMs ?? 30_000;
    this.info = await this.conn.json<ProcessInfo>('POST', this.#path('/wait'), {
      json: { timeoutMs: waitMs },
      signal: opts.signal,
      timeoutMs: opts.timeoutMs ?? waitMs + 10_000,
    });
    return this.info;
  }

  async signal(signal: SignalRequest['signal'], opts: CallOptions = {}): Promise<ProcessInfo> {
    this.info = await this.conn.json<ProcessInfo>('POST', this.#path('/signal'), { json: { signal }, ...opts });
    return this.info;
  }

  /** Kills the process and everything it started. */
  async kill(opts: CallOptions = {}): Promise<ProcessInfo> {
    this.info = await this.conn.json<ProcessInfo>('DELETE', this.#path(), opts);
    return this.info;
  }

  async writeStdin(data: string | Uint8Array, opts: CallOptions & { eof?: boolean } = {}): Promise<void> {
    const { eof, ...call } = opts;
    await this.conn.json<void>('POST', this.#path('/stdin'), {
      body: typeof data === 'string' ? new TextEncoder().encode(data) : data,
      query: { eof: eof ? 'true' : undefined },
      ...call,
    });
  }

  async closeStdin(opts: CallOptions = {}): Promise<void> {
    await this.writeStdin(new Uint8Array(0), { ...opts, eof: true });
  }
}

/** Runs commands in a sandbox. */
export class Commands {
  constructor(
    private readonly conn: Connection,
    private readonly id: string,
  ) {}

  /**
   * Runs a command to completion and returns its output (capped at maxOutputBytes per stream).
   * @example const r = await sandbox.commands.run('echo hi'); r.stdout === 'hi\n'
   */
  async run(cmd: string | string[], opts: RunOptions = {}): Promise<ExecResult> {
    const { signal, requestTimeoutMs, throwOnError, onStdout, onStderr, ...rest } = opts;
    const body: ExecRequest = { cmd, ...rest };
    checkExec(cmd, body, opts, 'commands.run');
    let result: ExecResult;
    if (onStdout || onStderr) {
      const enc = body.encoding ?? 'utf8';
      const out = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
      let exit: Extract<StreamEvent, { type: 'exit' }> | undefined;
      for await (const ev of this.stream(cmd, { ...rest, signal, requestTimeoutMs })) {
        if (ev.type === 'exit') exit = ev;
        else {
          out[ev.type].push(ev.data);
          (ev.type === 'stdout' ? onStdout : onStderr)?.(ev.data);
        }
      }
      if (!exit) throw new DsecError('the exec stream ended without an exit status', 'STREAM_ENDED', undefined);
      const { type: _t, ...status } = exit;
      result = { ...status, stdout: Buffer.concat(out.stdout).toString(enc), stderr: Buffer.concat(out.stderr).toString(enc) };
    } else {
      result = await this.conn.json<ExecResult>('POST', `/v1/sandboxes/${this.id}/exec`, {
        json: body,
        signal,
        timeoutMs: callTimeout(body, requestTimeoutMs),
      });
    }
    if (throwOnError && result.exitCode !== 0) throw new CommandExitError(result.exitCode, result.stdout, result.stderr);
    return result;
  }

  /**
   * Runs a command and yields its output as it is produced (bytes), then its exit status.
   * Breaking out of the loop disconnects, which kills the command.
   * @example for await (const ev of sb.commands.stream('make')) if (ev.type === 'stdout') process.stdout.write(ev.data);
   */
  async *stream(
    cmd: string | string[],
    opts: Omit<RunOptions, 'throwOnError' | 'onStdout' | 'onStderr'> = {},
  ): AsyncGenerator<StreamEvent> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body: ExecRequest = { cmd, ...rest };
    checkExec(cmd, body, opts, 'commands.stream');
    const timeoutMs = callTimeout(body, requestTimeoutMs);
    const path = `/v1/sandboxes/${this.id}/exec`;
    const res = await this.conn.request('POST', path, { json: body, signal, timeoutMs, accept: 'application/x-ndjson' });
    if (!res.body) return;
    try {
      for await (const line of readNdjson<{ type: string; data?: string } & Record<string, unknown>>(res.body)) {
        if (line.type === 'stdout' || line.type === 'stderr') yield { type: line.type, data: Buffer.from(line.data ?? '', 'base64') };
        else if (line.type === 'exit') yield line as unknown as StreamEvent;
      }
    } catch (err) {
      // The deadline or the caller's signal can fire while the body streams, not only before.
      throw abortedError(err, 'POST', path, timeoutMs, signal) ?? err;
    }
  }

  /** Starts a background process that outlives this call. */
  /** `timeoutMs` kills the process after that long; `requestTimeoutMs` bounds the HTTP call. */
  async start(
    cmd: string | string[],
    opts: Omit<StartProcessRequest, 'cmd'> & { signal?: AbortSignal; requestTimeoutMs?: number } = {},
  ): Promise<ProcessHandle> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body = { cmd, ...rest };
    checkExec(cmd, body, opts, 'commands.start');
    const info = await this.conn.json<ProcessInfo>('POST', `/v1/sandboxes/${this.id}/processes`, {
      json: body,
      signal,
      timeoutMs: requestTimeoutMs,
    });
    return new ProcessHandle(this.conn, this.id, info);
  }

  /** Background processes of the sandbox (running, and recently exited). */
  async list(opts: CallOptions = {}): Promise<ProcessHandle[]> {
    const res = await this.conn.json<{ processes: ProcessInfo[] }>('GET', `/v1/sandboxes/${this.id}/processes`, opts);
    return res.processes.map((p) => new ProcessHandle(this.conn, this.id, p));
  }

  /** A handle on a background process by id. */
  async connect(processId: string, opts: CallOptions = {}): Promise<ProcessHandle> {
    const out = await this.conn.json<ProcessOutput>('GET', `/v1/sandboxes/${this.id}/processes/${processId}`, opts);
    return new ProcessHandle(this.conn, this.id, out.process);
  }
}
