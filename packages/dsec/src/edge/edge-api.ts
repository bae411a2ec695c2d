import type {
  FileStat,
  Encoding, ExecRequest, ExecResult, ImageConfig, OpenSessionRequest, ProcessInfo, ProcessOutput, SessionExecRequest, SessionInfo, StartProcessRequest,
} from '@dsec/sdk/schema';
import type { Readable } from 'node:stream';
import type { ExecEvent } from '../exec/run-command.js';
import type { PtyOptions, PtyProcess } from '../exec/pty-process.js';
import type { LayerDigest } from '../image/layer-store.js';
import type { LayerCacheStats } from './layer-cache.js';
import type { Link } from '../net/address-pool.js';
import type { NetworkPolicy } from '../net/policy.js';

/** Limits after defaults are applied: every field is set. */
export interface SandboxLimits {
  cpu: number;
  memoryMiB: number;
  pids: number;
  /** Size of the writable layer; unset: no limit of its own (it shares the node's disk). */
  diskMiB?: number;
}

/** What the control plane asks an edge to run: everything resolved, nothing left to look up. */
export interface EdgeCreateRequest {
  id: string;
  /** Layers bottom first. */
  layers: LayerDigest[];
  config: ImageConfig;
  env: Record<string, string>;
  limits: SandboxLimits;
  /** Egress policy applied right after start; none (loopback only) when absent. */
  network?: NetworkPolicy;
}

export type EdgeSandboxStatus = 'running' | 'paused';

/** What pack_diff captured: a new layer over the sandbox's own layers, or none if nothing changed. */
export interface EdgeSnapshot {
  layer: LayerDigest | null;
  baseLayers: LayerDigest[];
  config: ImageConfig;
  stats: { entries: number; bytes: number; whiteouts: number; opaqueDirs: number; sparseFiles: number };
  frozenMs: number;
}

export interface EdgeSandbox {
  id: string;
  status: EdgeSandboxStatus;
  pid: number;
  createdAt: string;
}

export interface EdgeInfo {
  id: string;
  sandboxes: number;
  maxSandboxes: number;
  /** The node's layer cache: entries, bytes against the budget, mounted, evictions. */
  layerCache: LayerCacheStats;
}

/**
 * The control plane ↔ edge boundary. The control plane reaches an edge only through this
 * interface: in `dsec up` the Edge object itself implements it in-process; across nodes the
 * same calls go over HTTP. Errors are ApiErrors with registry codes.
 */
export interface EdgeApi {
  info(): Promise<EdgeInfo>;
  createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox>;
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
  sandboxUsage(id: string): Promise<{ oomKills: number; memoryBytes: number; pids: number }>;
  pauseSandbox(id: string): Promise<void>;
  setNetwork(id: string, policy: NetworkPolicy): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }>;
  /** The policy in force and the link, if the sandbox has one. */
  getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }>;
  resumeSandbox(id: string): Promise<void>;
  snapshotSandbox(id: string, opts?: { scrub?: string[] }): Promise<EdgeSnapshot>;

  /** An interactive command under a terminal (default: bash, else sh). */
  openPty(id: string, opts: Omit<PtyOptions, 'cmd'> & { cmd?: string[] | undefined }): Promise<PtyProcess>;

  readFile(id: string, path: string, maxBytes: number): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number>;
  statPath(id: string, path: string): Promise<FileStat>;
  listDir(id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }>;
  makeDir(id: string, path: string, parents: boolean): Promise<void>;
  removePath(id: string, path: string, recursive: boolean): Promise<void>;
  renamePath(id: string, from: string, to: string): Promise<void>;
  /** Unpacks a tar stream into dir (created if missing), inside the sandbox. */
  uploadTar(id: string, dir: string, body: Readable): Promise<number>;
  downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>>;
}
