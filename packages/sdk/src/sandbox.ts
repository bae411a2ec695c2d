import { batchEvents, type BatchProgress } from './batch.js';
import { errorFromWire } from './errors.js';
import {
  type BulkResult,
  CreateBatchRequest,
  type BatchEvent,
  type BatchInfo,
  type ListOrder,
  CreateSandboxRequest,
  type ForkResult,
  NetworkPolicyRequest,
  type NetworkPolicyResult,
  type NetworkPolicyState,
  type ReplayResult,
  type SandboxInfo,
  type SandboxCounts,
  type SandboxList,
  MigrateRequest,
  type MigrateResult,
  SnapshotRequest,
  type SnapshotResult,
  type Trajectory,
  type TrajectoryLine,
} from './schema/index.js';
import { checkBody, checkOptionalInt, checkPath } from './validate.js';
import { readNdjson } from './ndjson.js';
import { InvalidRequestError, UnreachableError } from './errors.js';
import { Commands } from './commands.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { Files } from './files.js';
import { bulk, type BulkOptions, countSandboxes, iterateSandboxes, listPage, listSandboxes, type ListOptions } from './listing.js';
import { Image } from './image.js';
import { Ports } from './ports.js';
import { Sessions } from './sessions.js';
import { Terminal, type TerminalOptions } from './terminal.js';

/** How a sandbox's trajectory is read: a page of its own steps, and whether its fork lineage comes first. */
export interface TrajectoryOptions {
  afterSeq?: number;
  limit?: number;
  lineage?: boolean;
}

/** A snapshot's result, with its image as an object (`snap.image.delete()`, `snap.image.refresh()`). */
export type Snapshot = SnapshotResult & { image: Image };

export type CreateOptions = Omit<CreateSandboxRequest, 'image'> & { image?: string } & ConnectionOptions & CallOptions;

/** createMany's options: the sandbox spec, plus how many creates run at once and a progress callback. */
export type CreateManyOptions = CreateOptions & {
  /** Creates in flight at once across the cluster. Default: the server's, 64 per ready edge of the spec's pool (see CreateBatchRequest). */
  concurrency?: number;
  onProgress?: (event: BatchEvent, progress: BatchProgress) => void;
};

/** An item of a batch that did not start, and why. */
export interface BatchFailure {
  index: number;
  code: string;
  reason: string;
  sandboxId?: string;
}

function failureOf(e: BatchEvent): BatchFailure {
  const f: BatchFailure = { index: e.index ?? -1, code: e.code ?? 'SANDBOX_CREATE_FAILED', reason: e.reason ?? 'unknown' };
  if (e.sandboxId) f.sandboxId = e.sandboxId;
  return f;
}

/** A handle on one sandbox. */
export class Sandbox {
  readonly commands: Commands;
  readonly files: Files;
  readonly sessions: Sessions;
  /** Servers in the sandbox, through the control plane's proxy: `ports.url/fetch/link/websocket/connect`. */
  readonly ports: Ports;

  private constructor(
    private readonly conn: Connection,
    public info: SandboxInfo,
  ) {
    this.commands = new Commands(conn, info.id);
    this.files = new Files(conn, info.id);
    this.sessions = new Sessions(conn, info.id);
    this.ports = new Ports(conn, info.id);
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
    const body: CreateSandboxRequest = { ...spec, image: spec.image ?? 'busybox' };
    checkBody(CreateSandboxRequest, body, 'Sandbox.create');
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    const info = await conn.json<SandboxInfo>('POST', '/v1/sandboxes', { json: body, signal, timeoutMs });
    return new Sandbox(conn, info);
  }

  /**
   * Creates `count` sandboxes of one spec as one batch (up to 32,000) and resolves when every one
   * is running or failed. `onProgress` hears each event (placed, running, failed with a reason).
   * A dropped progress stream is resumed where it left off.
   * @example const { sandboxes, failures } = await Sandbox.createMany(100, { image: 'busybox', onProgress: (e, p) => bar(p.running / p.count) });
   */
  static async createMany(
    count: number,
    opts: CreateManyOptions = {},
  ): Promise<{ batchId: string; sandboxes: Sandbox[]; failures: BatchFailure[] }> {
    const { conn, batchId, call } = await Sandbox.#startBatch(count, opts);
    const failures: BatchFailure[] = [];
    for await (const e of Sandbox.#progress(conn, batchId, count, opts, call)) {
      if (e.type === 'failed') failures.push(failureOf(e));
    }
    const res = await conn.json<SandboxList>('GET', '/v1/sandboxes', { query: { label: [`dsec.batch=${batchId}`] }, ...call });
    return { batchId, sandboxes: res.sandboxes.filter((s) => s.status === 'running').map((info) => new Sandbox(conn, info)), failures };
  }

  /**
   * The same batch as createMany, as an async iterator that yields each sandbox as soon as it
   * runs (failures go to `onProgress` and are thrown as one error at the end unless `allowFailures`).
   * @example for await (const sb of Sandbox.createManyIter(32, { image: 'py' })) void rollout(sb);
   */
  static async *createManyIter(count: number, opts: CreateManyOptions & { allowFailures?: boolean } = {}): AsyncGenerator<Sandbox> {
    const { allowFailures, ...rest } = opts;
    const { conn, batchId, call } = await Sandbox.#startBatch(count, rest);
    const failures: BatchFailure[] = [];
    for await (const e of Sandbox.#progress(conn, batchId, count, rest, call)) {
      if (e.type === 'running' && e.sandboxId)
        yield new Sandbox(conn, await conn.json<SandboxInfo>('GET', `/v1/sandboxes/${e.sandboxId}`, call));
      if (e.type === 'failed') failures.push(failureOf(e));
    }
    if (failures.length && !allowFailures) {
      throw errorFromWire(undefined, {
        code: failures[0]!.code,
        message: `${failures.length} of ${count} sandboxes of batch ${batchId} failed; first: ${failures[0]!.reason}`,
        details: { batchId, failures },
      });
    }
  }

  static async #startBatch(count: number, opts: CreateManyOptions): Promise<{ conn: Connection; batchId: string; call: CallOptions }> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, onProgress: _p, concurrency, ...spec } = opts;
    const body: CreateBatchRequest = { count, spec: { ...spec, image: spec.image ?? 'busybox' } };
    if (concurrency !== undefined) body.concurrency = concurrency;
    checkBody(CreateBatchRequest, body, 'Sandbox.createMany');
    const conn = new Connection({ url, apiKey, requestTimeoutMs });
    const call: CallOptions = {};
    if (signal) call.signal = signal;
    if (timeoutMs !== undefined) call.timeoutMs = timeoutMs;
    const info = await conn.json<BatchInfo>('POST', '/v1/batches', { json: body, ...call });
    return { conn, batchId: info.id, call };
  }

  static async *#progress(
    conn: Connection,
    batchId: string,
    count: number,
    opts: CreateManyOptions,
    call: CallOptions,
  ): AsyncGenerator<BatchEvent> {
    const p: BatchProgress = { count, placed: 0, running: 0, failed: 0 };
    for await (const e of batchEvents(conn, batchId, { signal: call.signal })) {
      if (e.type === 'placed') p.placed++;
      if (e.type === 'running') p.running++;
      if (e.type === 'failed') p.failed++;
      opts.onProgress?.(e, p);
      yield e;
    }
  }

  /** Cancels a batch: no more creates, and the sandboxes it made are killed. */
  static async cancelBatch(batchId: string, opts: ConnectionOptions & CallOptions = {}): Promise<BatchInfo> {
    const { signal, timeoutMs, ...connOpts } = opts;
    return new Connection(connOpts).json<BatchInfo>('DELETE', `/v1/batches/${encodeURIComponent(batchId)}`, { signal, timeoutMs });
  }

  /** Attaches to an existing sandbox by id. */
  static async connect(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<Sandbox> {
    const { signal, timeoutMs, ...connOpts } = opts;
    const conn = new Connection(connOpts);
    const info = await conn.json<SandboxInfo>('GET', `/v1/sandboxes/${encodeURIComponent(id)}`, { signal, timeoutMs });
    return new Sandbox(conn, info);
  }

  /** Lists sandboxes: those whose labels match all of `labels` (and `status`, `project`), all in one answer. */
  static async list(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    return listSandboxes(opts);
  }

  /**
   * One page of a listing, oldest first (`order: 'newest'`: newest first), with the cursor of the next (`next`, absent on the last).
   * @example let page = await Sandbox.listPage({ labels: { run: 'r1' }, limit: 1000 }); page = await Sandbox.listPage({ labels: { run: 'r1' }, limit: 1000, after: page.next });
   */
  static async listPage(opts: ListOptions & { limit: number; after?: string; order?: ListOrder }): Promise<SandboxList> {
    return listPage(opts);
  }

  /**
   * Every sandbox a listing selects, a page at a time (`pageSize`, default 1,000).
   * @example for await (const s of Sandbox.iterate({ labels: { run: 'r1' } })) console.log(s.id, s.status);
   */
  static iterate(opts: ListOptions & { pageSize?: number } = {}): AsyncGenerator<SandboxInfo> {
    return iterateSandboxes(opts);
  }

  /** Sandboxes by status, counted by the server: `{counts: {running: 31998, failed: 2}, total: 32000}`. */
  static async counts(opts: ConnectionOptions & CallOptions & { project?: string } = {}): Promise<SandboxCounts> {
    return countSandboxes(opts);
  }

  /**
   * Kills every sandbox whose labels match all of `labels` (at least one label: this never means
   * "all"), a few at a time on the server. Sandboxes already gone count as killed. With
   * `onProgress`, hears how far it is about every 500 ms.
   * @example const { ids, failures } = await Sandbox.killAll({ labels: { task: 't1' }, onProgress: (p) => console.log(p.done, '/', p.total) });
   */
  static async killAll(opts: BulkOptions): Promise<BulkResult> {
    return bulk('kill', opts);
  }

  /** Pauses every running sandbox whose labels match all of `labels`. */
  static async pauseAll(opts: BulkOptions): Promise<BulkResult> {
    return bulk('pause', opts);
  }

  /** Resumes every paused sandbox whose labels match all of `labels`. */
  static async resumeAll(opts: BulkOptions): Promise<BulkResult> {
    return bulk('resume', opts);
  }

  /** Refreshes `info` from the server. */
  async refresh(opts: CallOptions = {}): Promise<SandboxInfo> {
    this.info = await this.conn.json<SandboxInfo>('GET', `/v1/sandboxes/${this.id}`, opts);
    return this.info;
  }

  /**
   * Opens an interactive terminal (a pseudo-terminal in the sandbox).
   * @example const t = await sb.terminal({ cmd: ['python3'], onData: (d) => process.stdout.write(d) }); t.write('1+1\n');
   */
  async terminal(opts: TerminalOptions): Promise<Terminal> {
    return Terminal.open(this.conn, this.id, opts);
  }

  /**
   * The logged steps (commands, sessions, file changes, network switches, pauses) with their
   * results. Still readable after kill() for the server's retention time (default 24 h).
   * `lineage: true` (a fork): its ancestors' steps first, oldest first, each up to where the next
   * was forked from it, every entry with its `sandboxId`; `lineageMissing` names an ancestor whose
   * log is no longer kept. `afterSeq` and `limit` page the sandbox's own steps; the ancestors'
   * come on the first page.
   * @param opts.limit @default 1000 (at most 10000; page with afterSeq)
   * @example const { entries } = await fork.trajectory({ lineage: true }); // the parent's steps, then the fork's
   */
  async trajectory(opts: CallOptions & TrajectoryOptions = {}): Promise<Trajectory> {
    return Sandbox.#trajectory(this.conn, this.id, opts);
  }

  /** A sandbox's trajectory by id, also of one killed within the retention time (no connect needed). */
  static async trajectory(id: string, opts: ConnectionOptions & CallOptions & TrajectoryOptions = {}): Promise<Trajectory> {
    checkPath(id, 'id');
    const { url, apiKey, requestTimeoutMs, ...rest } = opts;
    return Sandbox.#trajectory(new Connection({ url, apiKey, requestTimeoutMs }), id, rest);
  }

  static async #trajectory(conn: Connection, id: string, opts: CallOptions & TrajectoryOptions): Promise<Trajectory> {
    const { afterSeq, limit, lineage, ...call } = opts;
    checkOptionalInt(afterSeq, 'afterSeq');
    checkOptionalInt(limit, 'limit', 1);
    return conn.json<Trajectory>('GET', `/v1/sandboxes/${encodeURIComponent(id)}/trajectory`, {
      query: { afterSeq: afterSeq?.toString(), limit: limit?.toString(), lineage: lineage ? 'true' : undefined },
      ...call,
    });
  }

  /**
   * Every step of many sandboxes at once: those whose labels match all of `labels` and/or the
   * items of `batch` (at least one of the two), live or killed within the retention time, as
   * they stream from the server: sandboxes in id order, each one's steps by seq, each line the
   * entry and its `sandboxId`. What a trainer logs at the end of a run; a batch of 32,000
   * sandboxes streams in constant memory on both sides. `project`: an admin key's filter.
   * @example for await (const step of Sandbox.trajectories({ labels: { run: '7' } })) out.write(JSON.stringify(step) + '\n');
   */
  static async *trajectories(
    opts: ConnectionOptions & CallOptions & { labels?: Record<string, string>; batch?: string; project?: string },
  ): AsyncGenerator<TrajectoryLine> {
    const { url, apiKey, requestTimeoutMs, signal, timeoutMs, labels, batch, project } = opts;
    const label = Object.entries(labels ?? {}).map(([k, v]) => `${k}=${v}`);
    // Checked here too: the server would refuse it, but the message can name the SDK's own call.
    if (label.length === 0 && batch === undefined)
      throw new InvalidRequestError(
        'Sandbox.trajectories needs labels (all must match) and/or batch; one sandbox: Sandbox.trajectory(id)',
        'INVALID_REQUEST',
        undefined,
        { field: 'labels' },
      );
    const res = await new Connection({ url, apiKey, requestTimeoutMs }).request('GET', '/v1/trajectories', {
      query: { label, batch, project },
      accept: 'application/x-ndjson',
      signal,
      // The deadline of the whole stream, not of its first byte: a big run takes a while to read.
      timeoutMs: timeoutMs ?? 24 * 3600_000,
    });
    if (!res.body) throw new UnreachableError('the trajectories stream has no body', 'STREAM_BROKEN', res.status);
    yield* readNdjson<TrajectoryLine>(res.body);
  }

  /** Rebuilds this sandbox as a new one from its image and trajectory (e.g. after its node was lost). */
  async replay(opts: CallOptions = {}): Promise<{ sandbox: Sandbox; result: ReplayResult }> {
    const result = await this.conn.json<ReplayResult>('POST', `/v1/sandboxes/${this.id}/replay`, { timeoutMs: 600_000, ...opts });
    return { sandbox: new Sandbox(this.conn, result.sandbox), result };
  }

  /**
   * Switches the sandbox's egress policy at runtime (e.g. a setup phase that may reach a package
   * mirror, then a rollout phase with nothing); in force when this returns.
   * @example await sb.setNetwork({ mode: 'allow', allow: ['deb.debian.org:80'] }); … await sb.setNetwork({ mode: 'none' });
   */
  async setNetwork(policy: NetworkPolicyRequest, opts: CallOptions = {}): Promise<NetworkPolicyResult> {
    checkBody(NetworkPolicyRequest, policy, 'setNetwork');
    return this.conn.json<NetworkPolicyResult>('PUT', `/v1/sandboxes/${this.id}/network`, { json: policy, ...opts });
  }

  /** The egress policy in force, and the sandbox's link to the host if it has one. */
  async network(opts: CallOptions = {}): Promise<NetworkPolicyState> {
    return this.conn.json<NetworkPolicyState>('GET', `/v1/sandboxes/${this.id}/network`, opts);
  }

  /** Freezes the sandbox; memory stays resident. Commands answer 409 until resume(). */
  async pause(opts: CallOptions = {}): Promise<SandboxInfo> {
    this.info = await this.conn.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/pause`, opts);
    return this.info;
  }

  async resume(opts: CallOptions = {}): Promise<SandboxInfo> {
    this.info = await this.conn.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/resume`, opts);
    return this.info;
  }

  /**
   * Captures the sandbox's changes (pack_diff) as an image; `Sandbox.create({ image: snap.imageId })`
   * restores it. Unless named or `keep: true`, the image is deleted once this sandbox and every
   * sandbox started from it are killed (`snap.kept` says which).
   * @param opts.timeoutMs @default 600000
   * @example const snap = await sb.snapshot({ name: 'task-42:step-3' });
   */
  /**
   * Moves the sandbox to another edge (an admin key's call): same id, labels, files, network
   * policy, trajectory and TTL. Calls on it meanwhile wait, or are retried on SANDBOX_MIGRATING.
   * A container running processes besides its init is refused (SANDBOX_NOT_MIGRATABLE) unless
   * `restartProcesses`, which ends them (the result names them).
   */
  async migrate(opts: MigrateRequest & CallOptions = {}): Promise<MigrateResult> {
    const { signal, timeoutMs, ...body } = opts;
    checkBody(MigrateRequest, body, 'migrate');
    const result = await this.conn.json<MigrateResult>('POST', `/v1/sandboxes/${this.id}/migrate`, {
      json: body,
      signal,
      timeoutMs: timeoutMs ?? 600_000,
    });
    this.info = result.sandbox;
    return result;
  }

  async snapshot(opts: SnapshotRequest & CallOptions = {}): Promise<Snapshot> {
    const { signal, timeoutMs, ...body } = opts;
    checkBody(SnapshotRequest, body, 'snapshot');
    const result = await this.conn.json<SnapshotResult>('POST', `/v1/sandboxes/${this.id}/snapshot`, {
      json: body,
      signal,
      timeoutMs: timeoutMs ?? 600_000,
    });
    return { ...result, image: Image.fromSnapshot(this.conn, result.imageId) };
  }

  /** One snapshot, then `count` new sandboxes from it: rollouts from the same state. */
  async fork(
    count: number,
    opts: CallOptions & { labels?: Record<string, string> } = {},
  ): Promise<{ sandboxes: Sandbox[]; result: ForkResult }> {
    const { signal, timeoutMs, labels } = opts;
    checkOptionalInt(count, 'count', 1);
    const result = await this.conn.json<ForkResult>('POST', `/v1/sandboxes/${this.id}/fork`, {
      json: labels ? { count, labels } : { count },
      signal,
      timeoutMs: timeoutMs ?? 600_000,
    });
    return { sandboxes: result.sandboxes.map((i) => new Sandbox(this.conn, i)), result };
  }

  /**
   * Kills the sandbox and removes everything it had. Idempotent: killing a sandbox that is
   * already killed or gone succeeds, so `finally { await sb.kill() }` is safe.
   */
  async kill(opts: CallOptions = {}): Promise<void> {
    await this.conn.json<void>('DELETE', `/v1/sandboxes/${this.id}`, opts);
  }

  /** Kills a sandbox by id without connecting first; idempotent like `kill()`. */
  static async kill(id: string, opts: ConnectionOptions & CallOptions = {}): Promise<void> {
    const { signal, timeoutMs, ...connOpts } = opts;
    checkPath(id, 'id');
    await new Connection(connOpts).json<void>('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`, { signal, timeoutMs });
  }
}
