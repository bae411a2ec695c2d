import type { Duplex } from 'node:stream';
import type {
  Encoding,
  ExecRequest,
  FnRunResult,
  ExecResult,
  FileStat,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ExecEvent } from '../protocol/exec-event.js';
import type { Link } from '../../net/address-pool.js';
import type { NetworkPolicy } from '../../net/policy.js';
import type { Edge } from './container/container-backend.js';
import { createEach } from '../protocol/create-each.js';
import {
  type EdgeApi,
  type EdgeCreateOutcome,
  type EdgeCreateRequest,
  type EdgeFnRequest,
  type EdgeInfo,
  type EdgeNetworkRequest,
  type EdgeSandbox,
  type EdgeSnapshot,
  type TerminalChannel,
  type TerminalRequest,
} from '../protocol/edge-api.js';
import type { SandboxBackend } from './backend.js';
import type { FnCalls } from './fncall/fn-calls.js';
import type { VmBackend } from './vm/vm-backend.js';

/** Creates of a group that run at once on this node (crun and mounts gain nothing from more on its cores). */
const CREATES_AT_ONCE = 8;

/**
 * The node's EdgeApi: creates go to the backend the request names, every other call to the
 * backend that owns the sandbox (VMs are known by id; anything else is the container Edge, which
 * answers SANDBOX_NOT_FOUND for ids it does not have). Both share the node's sandbox budget.
 * Function calls go to the FnCall backend, whose worker sandboxes are the node's own: they are
 * left out of listings, so the control plane neither sees nor reconciles them.
 */
export class BackendDispatch implements EdgeApi {
  constructor(
    readonly containers: Edge,
    readonly vms: VmBackend | undefined,
    readonly fn?: FnCalls,
  ) {}

  runFn(req: EdgeFnRequest, signal?: AbortSignal): Promise<FnRunResult> {
    if (!this.fn) throw new ApiError('BACKEND_UNSUPPORTED', `edge ${this.containers.id} runs no function calls`, { backend: 'fncall' });
    return this.fn.run(req, signal);
  }

  #for(id: string): SandboxBackend {
    return this.vms?.owns(id) ? this.vms : this.containers;
  }

  /**
   * The container edge's info with the VMs counted in (sandboxes, committed CPU and memory, and
   * capacity.vms) and the function-call workers counted out: they are the node's own, never
   * listed, so `sandboxes` counts what the control plane placed here (a drained edge leaves once
   * that is 0; its workers go with it) and the slots the workers hold are not on offer.
   */
  async info(): Promise<EdgeInfo> {
    const own = await this.containers.info();
    const workers = this.fn ? (await this.containers.listSandboxes()).filter((s) => this.fn!.owns(s.id)).length : 0;
    const info = { ...own, sandboxes: own.sandboxes - workers, maxSandboxes: own.maxSandboxes - workers };
    if (!this.vms) return info;
    const { cpuCommitted, ...vms } = this.vms.capacity();
    const c = info.capacity;
    return {
      ...info,
      sandboxes: info.sandboxes + this.vms.count,
      capacity: {
        ...c,
        cpuCommitted: Math.round((c.cpuCommitted + cpuCommitted) * 1000) / 1000,
        memoryCommittedMiB: c.memoryCommittedMiB + vms.memoryCommittedMiB,
        vms,
      },
    };
  }

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    const kind = req.backend ?? 'container';
    if (kind === 'container') {
      if (req.restoreFrom !== undefined)
        throw new ApiError('INVALID_REQUEST', 'restoreFrom restores a VM snapshot; a container starts from a snapshot image instead', {
          field: 'restoreFrom',
        });
      return this.containers.createSandbox(req);
    }
    if (!this.vms)
      throw new ApiError('BACKEND_UNSUPPORTED', `this edge runs no ${kind} sandboxes (no VM guest was built)`, { backend: kind });
    const info = await this.info();
    if (info.sandboxes >= info.maxSandboxes) {
      throw new ApiError('CAPACITY_EXCEEDED', `edge ${info.id} is full (${info.maxSandboxes} sandboxes)`, {
        maxSandboxes: info.maxSandboxes,
      });
    }
    return this.vms.createSandbox(req);
  }

  createSandboxes(reqs: EdgeCreateRequest[]): Promise<EdgeCreateOutcome[]> {
    return createEach((r) => this.createSandbox(r), reqs, CREATES_AT_ONCE);
  }

  killSandbox(id: string): Promise<void> {
    return this.#for(id).killSandbox(id);
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    const containers = (await this.containers.listSandboxes()).filter((s) => !this.fn?.owns(s.id));
    return [...containers, ...(this.vms ? await this.vms.listSandboxes() : [])];
  }

  exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    return this.#for(id).exec(id, req, signal);
  }

  execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    return this.#for(id).execStream(id, req, signal);
  }

  startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    return this.#for(id).startProcess(id, req);
  }

  listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#for(id).listProcesses(id);
  }

  processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#for(id).processOutput(id, pid, offsets, encoding);
  }

  waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#for(id).waitProcess(id, pid, timeoutMs);
  }

  signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    return this.#for(id).signalProcess(id, pid, signal);
  }

  writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    return this.#for(id).writeProcessStdin(id, pid, data, eof);
  }

  openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    return this.#for(id).openSession(id, req);
  }

  listSessions(id: string): Promise<SessionInfo[]> {
    return this.#for(id).listSessions(id);
  }

  sessionExec(id: string, sid: string, req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#for(id).sessionExec(id, sid, req, signal);
  }

  closeSession(id: string, sid: string): Promise<void> {
    return this.#for(id).closeSession(id, sid);
  }

  sandboxUsage(id: string): Promise<{ oomKills: number; memoryBytes: number; pids: number }> {
    return this.#for(id).sandboxUsage(id);
  }

  pauseSandbox(id: string): Promise<void> {
    return this.#for(id).pauseSandbox(id);
  }

  resumeSandbox(id: string): Promise<void> {
    return this.#for(id).resumeSandbox(id);
  }

  setNetwork(id: string, policy: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    return this.#for(id).setNetwork(id, policy);
  }

  getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    return this.#for(id).getNetwork(id);
  }

  snapshotSandbox(id: string, opts?: { scrub?: string[]; signal?: AbortSignal; memory?: boolean }): Promise<EdgeSnapshot> {
    return this.#for(id).snapshotSandbox(id, opts);
  }

  openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    return this.#for(id).openPty(id, req);
  }

  /** Volumes are the node's, kept by the container edge (VMs do not mount them yet). */
  createVolume(name: string): Promise<void> {
    return this.containers.createVolume(name);
  }

  deleteVolume(name: string): Promise<void> {
    return this.containers.deleteVolume(name);
  }

  volumeUsage(name: string): Promise<{ bytes: number }> {
    return this.containers.volumeUsage(name);
  }

  openPort(id: string, port: number): Promise<Duplex> {
    return this.#for(id).openPort(id, port);
  }

  readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return this.#for(id).readFile(id, path, maxBytes);
  }

  writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    return this.#for(id).writeFile(id, path, data, mode);
  }

  statPath(id: string, path: string): Promise<FileStat> {
    return this.#for(id).statPath(id, path);
  }

  listDir(id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return this.#for(id).listDir(id, path);
  }

  makeDir(id: string, path: string, parents: boolean): Promise<void> {
    return this.#for(id).makeDir(id, path, parents);
  }

  removePath(id: string, path: string, recursive: boolean): Promise<void> {
    return this.#for(id).removePath(id, path, recursive);
  }

  renamePath(id: string, from: string, to: string): Promise<void> {
    return this.#for(id).renamePath(id, from, to);
  }

  uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    return this.#for(id).uploadTar(id, dir, body);
  }

  downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    return this.#for(id).downloadTar(id, path);
  }
}
