import type { CreateSandboxRequest, ExecRequest, ExecResult, SandboxInfo, SandboxList, WriteFileResult } from './schema/index.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { CommandExitError } from './errors.js';

export type CreateOptions = Omit<CreateSandboxRequest, 'image'> & { image?: string } & ConnectionOptions & CallOptions;
export type RunOptions = Omit<ExecRequest, 'cmd'> & CallOptions & {
  /** Throw CommandExitError when the exit code is not 0. @default false */
  throwOnError?: boolean;
};

/** Runs commands in a sandbox. */
export class Commands {
  constructor(
    private readonly conn: Connection,
    private readonly id: string,
  ) {}

  /**
   * Runs a command to completion and returns its output.
   * @example const r = await sandbox.commands.run('echo hi'); r.stdout === 'hi\n'
   */
  async run(cmd: string | string[], opts: RunOptions = {}): Promise<ExecResult> {
    const { signal, timeoutMs, throwOnError, ...rest } = opts;
    const body: ExecRequest = { cmd, ...rest };
    if (timeoutMs !== undefined) body.timeoutMs = timeoutMs;
    // The HTTP call waits for the command, so give it a margin over the command's own timeout.
    const callTimeout = (body.timeoutMs ?? 60_000) + 10_000;
    const result = await this.conn.json<ExecResult>('POST', `/v1/sandboxes/${this.id}/exec`, {
      json: body,
      signal,
      timeoutMs: callTimeout,
    });
    if (throwOnError && result.exitCode !== 0) throw new CommandExitError(result.exitCode, result.stdout, result.stderr);
    return result;
  }
}

/** Reads and writes files inside a sandbox; paths resolve inside its root. */
export class Files {
  constructor(
    private readonly conn: Connection,
    private readonly id: string,
  ) {}

  async read(path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    const res = await this.conn.request('GET', `/v1/sandboxes/${this.id}/files`, { query: { path }, ...opts });
    return new Uint8Array(await res.arrayBuffer());
  }

  async readText(path: string, opts: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  async write(path: string, data: string | Uint8Array, opts: CallOptions & { mode?: number } = {}): Promise<WriteFileResult> {
    const body = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const { mode, ...call } = opts;
    return this.conn.json<WriteFileResult>('PUT', `/v1/sandboxes/${this.id}/files`, {
      body,
      query: { path, mode: mode === undefined ? undefined : mode.toString(8) },
      ...call,
    });
  }
}

/** A handle on one sandbox. */
export class Sandbox {
  readonly commands: Commands;
  readonly files: Files;

  private constructor(
    private readonly conn: Connection,
    public info: SandboxInfo,
  ) {
    this.commands = new Commands(conn, info.id);
    this.files = new Files(conn, info.id);
  }

  get id(): string {
    return this.info.id;
  }

  /**
   * Creates a sandbox and returns when it is running.
   * @example const sb = await Sandbox.create({ image: 'busybox', resources: { memoryMiB: 64 } });
   */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, ...spec } = opts;
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    const body: CreateSandboxRequest = { ...spec, image: spec.image ?? 'busybox' };
    const info = await conn.json<SandboxInfo>('POST', '/v1/sandboxes', { json: body, signal, timeoutMs });
    return new Sandbox(conn, info);
  }

  /** Attaches to an existing sandbox by id. */
  static async connect(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<Sandbox> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    const info = await conn.json<SandboxInfo>('GET', `/v1/sandboxes/${encodeURIComponent(id)}`, { signal, timeoutMs });
    return new Sandbox(conn, info);
  }

  /** Lists sandboxes, optionally those whose labels match all of `labels`. */
  static async list(opts: ConnectionOptions & CallOptions & { labels?: Record<string, string> } = {}): Promise<SandboxInfo[]> {
    const { signal, timeoutMs, labels, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    const label = Object.entries(labels ?? {}).map(([k, v]) => `${k}=${v}`);
    const res = await conn.json<SandboxList>('GET', '/v1/sandboxes', { query: { label }, signal, timeoutMs });
    return res.sandboxes;
  }

  /** Refreshes `info` from the server. */
  async refresh(opts: CallOptions = {}): Promise<SandboxInfo> {
    this.info = await this.conn.json<SandboxInfo>('GET', `/v1/sandboxes/${this.id}`, opts);
    return this.info;
  }

  /** Kills the sandbox and removes everything it had. */
  async kill(opts: CallOptions = {}): Promise<void> {
    await this.conn.json<void>('DELETE', `/v1/sandboxes/${this.id}`, opts);
  }
}
