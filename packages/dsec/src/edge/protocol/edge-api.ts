import type {
  FileStat,
  FnRunResult,
  Encoding,
  ExecRequest,
  ExecResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
  SandboxUsage,
} from '@dsec/sdk/schema';
import type { Duplex } from 'node:stream';
import type { ExecEvent } from './exec-event.js';
import type { FileCallOptions, StatOptions, WriteFileOptions } from './file-options.js';
import type { Link } from '../../net/address-pool.js';
import type { NetworkPolicy } from '../../net/policy.js';
import type {
  EdgeCreateOutcome,
  EdgeCreateRequest,
  EdgeFnRequest,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeQuiesce,
  EdgeSandbox,
  EdgeSnapshot,
} from './schemas.js';

export type {
  EdgeCreateOutcome,
  EdgeCreateRequest,
  EdgeFnRequest,
  EdgeHeartbeatInfo,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeQuiesce,
  EdgeSandbox,
  EdgeSessionCarry,
  EdgeSnapshot,
  SandboxLimits,
  EdgeSandboxStatus,
} from './schemas.js';
export type { FileActor, FileCallOptions, FileMetadataWrite, StatOptions, WriteFileOptions } from './file-options.js';

/**
 * An interactive terminal as a channel of bytes: output out, keystrokes and resizes in, one exit
 * code. In-process it wraps a PtyProcess; over the network it is a WebSocket.
 */
export interface TerminalChannel {
  readonly exit: Promise<number>;
  onData(listener: (data: Buffer) => void): void;
  write(data: Buffer | string): void;
  resize(cols: number, rows: number): void;
  /** Ends the terminal's command (and its process tree). */
  kill(): void;
}

export interface TerminalRequest {
  cmd?: string[] | undefined;
  cols: number;
  rows: number;
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
}

/**
 * The control plane ↔ edge boundary, as a wire contract (schemas in protocol/schemas.ts). The
 * control plane reaches an edge only through this interface: in `dsec up` the Edge object itself
 * implements it in-process; across nodes HttpEdgeClient implements the same calls over HTTP, and
 * one contract test suite runs against both. Everything crossing it is a schema'd value, a byte
 * stream or a terminal channel; failures are errors carrying a registry code (ApiError), which
 * the HTTP client rebuilds from `{error:{code,message,details}}`.
 */
/** Who hears a group create as it goes. */
export interface GroupCreateListener {
  /** The edge has the group and has started its creates (at once, before any settles). */
  accepted?(): void;
  /** One item settled: its index in the group and its outcome. */
  outcome?(index: number, outcome: EdgeCreateOutcome): void;
}

export interface EdgeApi {
  info(): Promise<EdgeInfo>;
  createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox>;
  /**
   * Many creates in one call (a batch's group for this edge): one round trip instead of one per
   * sandbox; each item succeeds or fails on its own, in the order given. A `listener` hears when
   * the edge has the group and each item as it settles (over HTTP the answer is then NDJSON: a
   * line when the edge has the group, then a line per item), so one create of a group need not
   * wait for the group's slowest, nor the next group for this one.
   */
  createSandboxes(reqs: EdgeCreateRequest[], listener?: GroupCreateListener): Promise<EdgeCreateOutcome[]>;
  killSandbox(id: string): Promise<void>;
  listSandboxes(): Promise<EdgeSandbox[]>;
  exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult>;
  /** Output as it is produced, then the exit; stopping iteration kills the command. */
  execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncIterable<ExecEvent>;

  startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo>;
  listProcesses(id: string): Promise<ProcessInfo[]>;
  processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput>;
  waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo>;
  signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo>;
  writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void>;

  openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo>;
  listSessions(id: string): Promise<SessionInfo[]>;
  sessionExec(id: string, sid: string, req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }>;
  closeSession(id: string, sid: string): Promise<void>;

  /** Live cgroup usage: OOM kills, memory, process count. */
  sandboxUsage(id: string): Promise<SandboxUsage>;
  pauseSandbox(id: string): Promise<void>;
  resumeSandbox(id: string): Promise<void>;
  /**
   * Holds a sandbox still for a move to another edge: frozen (paused), with the processes it runs
   * besides its init listed. A container with such processes is thawed again and left as it was
   * unless `endProcesses`, which ends them first; a VM is only paused (its processes move with it).
   * Undone by resumeSandbox unless it was paused before.
   */
  quiesceSandbox(id: string, opts: { endProcesses: boolean }): Promise<EdgeQuiesce>;
  /** Host names in the allow list are resolved by the edge, on its node. */
  setNetwork(id: string, policy: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }>;
  /** The policy in force and the link, if the sandbox has one. */
  getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }>;
  /** pack_diff; the new layer is in the cluster's blob store when this returns. */
  /** `signal`: the caller has gone; the copy and mkfs.erofs stop and leave nothing behind. */
  /** VMs: `memory`, their state for a fork on this edge; with `portable`, as a blob (`state`) any edge's create restores (`restoreState`). */
  snapshotSandbox(
    id: string,
    opts?: { scrub?: string[]; signal?: AbortSignal; memory?: boolean; portable?: boolean },
  ): Promise<EdgeSnapshot>;

  /** An interactive command under a terminal (default: bash, else sh). */
  openPty(id: string, req: TerminalRequest): Promise<TerminalChannel>;
  /**
   * A TCP connection to `port` on the sandbox's own loopback, as a byte stream (half-close passed
   * on): for the port proxy. Works under every network policy, `none` included. Rejects with
   * PORT_NOT_LISTENING when nothing accepts on that port.
   */
  openPort(id: string, port: number): Promise<Duplex>;

  /** A named volume on this node (VOLUME_EXISTS if it has one of that name). */
  createVolume(name: string): Promise<void>;
  /** Removes a volume and its files; VOLUME_IN_USE while a sandbox of this edge mounts it. */
  deleteVolume(name: string): Promise<void>;
  /** Apparent size of a volume's files. */
  volumeUsage(name: string): Promise<{ bytes: number }>;

  /*
   * File calls act as the sandbox's root unless `opts.as` names one of its users: the kernel then
   * decides each access as for that user (FILE_PERMISSION_DENIED when it refuses) and what the
   * call creates is that user's. uid 0 is root, as without `as`.
   */
  readFile(id: string, path: string, maxBytes: number, opts?: FileCallOptions): Promise<Buffer>;
  /** `opts.metadata`: the file's user xattrs under its prefix, set after the bytes are written. */
  writeFile(id: string, path: string, data: Buffer, mode: number, opts?: WriteFileOptions): Promise<number>;
  statPath(id: string, path: string, opts?: StatOptions): Promise<FileStat>;
  listDir(id: string, path: string, opts?: StatOptions): Promise<{ entries: FileStat[]; truncated: boolean }>;
  makeDir(id: string, path: string, parents: boolean, opts?: FileCallOptions): Promise<void>;
  removePath(id: string, path: string, recursive: boolean, opts?: FileCallOptions): Promise<void>;
  renamePath(id: string, from: string, to: string, opts?: FileCallOptions): Promise<void>;
  /** Unpacks a tar byte stream into dir (created if missing), inside the sandbox. */
  uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number>;
  downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>>;

  /**
   * A function call in one of the node's warm workers (edge/backends/fncall/). Served by the node's
   * dispatch when it has the FnCall backend; an edge without it has no such method.
   */
  runFn?(req: EdgeFnRequest, signal?: AbortSignal): Promise<FnRunResult>;
}
