import { mkdirSync, chmodSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type {
  Encoding,
  ExecRequest,
  ExecResult,
  FileStat,
  FnRunResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
  SandboxUsage,
} from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import type { LayerDigest } from '../image/layer-store.js';
import type { Link } from '../net/address-pool.js';
import { NodeLinks } from '../net/node-links.js';
import type { NetworkPolicy } from '../net/policy.js';
import type { SandboxBackend } from './backends/backend.js';
import { ContainerBackend } from './backends/container/container-backend.js';
import type { ContainerOptions } from './backends/container/container-options.js';
import { FnCalls } from './backends/fncall/fn-calls.js';
import { VmBackend } from './backends/vm/vm-backend.js';
import { NodeBudget } from './node/node-budget.js';
import { nodeInfo } from './node/node-info.js';
import { NodeLayers, type LazyLayerOptions } from './node/node-layers.js';
import { NodeVolumes } from './node/node-volumes.js';
import { createEach } from './protocol/create-each.js';
import type {
  EdgeApi,
  GroupCreateListener,
  EdgeCreateOutcome,
  EdgeCreateRequest,
  EdgeFnRequest,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeSandbox,
  EdgeQuiesce,
  EdgeSnapshot,
  FileCallOptions,
  StatOptions,
  TerminalChannel,
  TerminalRequest,
  WriteFileOptions,
} from './protocol/edge-api.js';
import type { ExecEvent } from './protocol/exec-event.js';

/** The node's options: the container backend's, and the node's layers'. */
export interface EdgeOptions extends Omit<ContainerOptions, 'layers' | 'links' | 'volumes'> {
  /** Budget of the node's layer cache; default DEFAULT_LAYER_CACHE_BYTES. */
  layerCacheBytes?: number;
  /** Whether another backend (VMs) holds a layer, so the cache keeps it. */
  layerInUse?: (digest: LayerDigest) => boolean;
  /**
   * Lazy layers (`--layer-fetch lazy`): layers are mounted from dsec-chunk-fuse, whose chunks come
   * from this blob store on first read, instead of being brought in whole. Unset: eager.
   */
  lazy?: LazyLayerOptions;
  /** CPU limits may add up to this many times the node's CPUs (`--cpu-overcommit`); 0 or unset: no cap. */
  cpuOvercommit?: number;
}

/** Creates of a group that run at once on this node (crun and mounts gain nothing from more on its cores). */
const CREATES_AT_ONCE = 8;

/**
 * One node, as the EdgeApi the control plane reaches (in-process in `dsec up`, over HTTP from
 * `dsec edge`): the node's shared parts (layers, links, volumes: edge/node/) and its backends
 * (edge/backends/), composed. A create goes to the backend the request names, every other call
 * to the backend that owns the sandbox (VMs are known by id; anything else is the container
 * backend, which answers SANDBOX_NOT_FOUND for ids it does not have). Both share the node's
 * sandbox budget. Function calls go to the FnCall backend, whose worker sandboxes are the node's
 * own: they are left out of listings, so the control plane neither sees nor reconciles them.
 */
export class Edge implements EdgeApi {
  readonly id: string;
  readonly layers: NodeLayers;
  /** The node's sandbox links (address pool, host guard, dsec-nft), shared by the container and VM backends. */
  readonly links: NodeLinks;
  readonly volumes: NodeVolumes;
  /** Slots and CPU held by creates in flight, across backends: the node's word on what fits (node-budget.ts). */
  readonly #budget: NodeBudget;
  readonly containers: ContainerBackend;
  /** Unset when no VM guest was built (logged at construction). */
  readonly vms: VmBackend | undefined;
  readonly fn: FnCalls;

  constructor(opts: EdgeOptions) {
    this.id = opts.id;
    // 0700: nothing under the node dir is any host user's business but root's (see sandboxes-mount.ts).
    mkdirSync(opts.nodeDir, { recursive: true, mode: 0o700 });
    chmodSync(opts.nodeDir, 0o700);
    this.links = new NodeLinks(opts.id);
    // The layer cache asks the VM backend, which needs that cache, and the lazy store's death
    // ends container sandboxes: both are tied through `this`, read when called.
    this.layers = new NodeLayers({
      nodeDir: opts.nodeDir,
      blobs: opts.blobs,
      layerCacheBytes: opts.layerCacheBytes,
      layerInUse: (d: LayerDigest) => (this.vms?.layerInUse(d) ?? false) || (opts.layerInUse?.(d) ?? false),
      lazy: opts.lazy,
      onLazyDaemonDeath: (reason) => void this.containers.lazyLayersLost(reason),
      log: opts.log,
    });
    this.volumes = new NodeVolumes(join(opts.nodeDir, 'volumes'));
    this.containers = new ContainerBackend({ ...opts, layers: this.layers, links: this.links, volumes: this.volumes });
    const setup = VmBackend.create({
      nodeDir: opts.nodeDir,
      layerCache: this.layers.cache,
      links: this.links,
      blobs: opts.blobs,
      log: opts.log.child({ backend: 'vm' }),
    });
    this.vms = setup.backend;
    if (setup.missing) opts.log.warn(`microVM/VM sandboxes are off: ${setup.missing}`);
    this.fn = new FnCalls(this.containers, { log: opts.log.child({ backend: 'fncall' }) });
    this.#budget = new NodeBudget(opts.id, opts.cpuOvercommit ?? 0, () => {
      const vmLimits = this.vms?.limits() ?? [];
      let cpu = vmLimits.reduce((n, l) => n + l.cpu, 0);
      for (const l of this.containers.limits()) cpu += l.cpu;
      return {
        sandboxes: this.containers.count - this.fn.workers + vmLimits.length,
        maxSandboxes: this.containers.maxSandboxes - this.fn.workers,
        cpuCommitted: cpu,
        cpus: availableParallelism(),
      };
    });
  }

  get state(): EdgeInfo['state'] {
    return this.containers.state;
  }

  /** VMs first: the containers' start reconciles the layer cache, which must see the VMs' layers. */
  async start(): Promise<void> {
    await this.vms?.start();
    await this.containers.start();
    await this.fn.start();
  }

  async shutdown(opts: { killAll?: boolean } = {}): Promise<void> {
    // Workers hold nothing worth keeping: they go whether or not the sandboxes stay.
    await this.fn.shutdown();
    await this.vms?.shutdown(opts);
    // Last: it closes the node's links and layers, which sandboxes of every backend used.
    await this.containers.shutdown(opts);
  }

  runFn(req: EdgeFnRequest, signal?: AbortSignal): Promise<FnRunResult> {
    return this.fn.run(req, signal);
  }

  #for(id: string): SandboxBackend {
    return this.vms?.owns(id) ? this.vms : this.containers;
  }

  async info(): Promise<EdgeInfo> {
    const workers = (await this.containers.listSandboxes()).filter((s) => this.fn.owns(s.id)).length;
    return nodeInfo({
      id: this.id,
      state: this.containers.state,
      maxSandboxes: this.containers.maxSandboxes,
      containers: this.containers,
      layers: this.layers,
      workers,
      vms: this.vms ? { ...this.vms.capacity(), count: this.vms.count } : undefined,
    });
  }

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    const kind = req.backend ?? 'container';
    if (kind === 'container') {
      if (req.restoreFrom !== undefined)
        throw new ApiError('INVALID_REQUEST', 'restoreFrom restores a VM snapshot; a container starts from a snapshot image instead', {
          field: 'restoreFrom',
        });
      if (req.restoreState !== undefined)
        throw new ApiError('INVALID_REQUEST', 'restoreState restores a VM state; a container starts from a snapshot image instead', {
          field: 'restoreState',
        });
    } else if (!this.vms)
      throw new ApiError('BACKEND_UNSUPPORTED', `this edge runs no ${kind} sandboxes (no VM guest was built)`, { backend: kind });
    // Held before the first await, so concurrent creates (from any number of replicas) never
    // overfill the node between two looks at it.
    const release = this.#budget.hold(req.limits);
    try {
      return kind === 'container' ? await this.containers.createSandbox(req) : await this.vms!.createSandbox(req);
    } finally {
      release();
    }
  }

  createSandboxes(reqs: EdgeCreateRequest[], listener?: GroupCreateListener): Promise<EdgeCreateOutcome[]> {
    return createEach((r) => this.createSandbox(r), reqs, CREATES_AT_ONCE, listener);
  }

  // --- volumes: the node's (VMs do not mount them yet) -----------------------------------------

  async createVolume(name: string): Promise<void> {
    this.volumes.create(name);
  }

  async deleteVolume(name: string): Promise<void> {
    const users = this.containers.volumeUsers(name);
    if (users.length)
      throw new ApiError('VOLUME_IN_USE', `volume ${name} is mounted by ${users.join(', ')}: kill them first`, { name, sandboxes: users });
    await this.volumes.remove(name);
  }

  async volumeUsage(name: string): Promise<{ bytes: number }> {
    return { bytes: await this.volumes.bytes(name) };
  }

  // --- every other call: the backend that owns the sandbox ---------------------------------------

  killSandbox(id: string): Promise<void> {
    return this.#for(id).killSandbox(id);
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    const containers = (await this.containers.listSandboxes()).filter((s) => !this.fn.owns(s.id));
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

  sandboxUsage(id: string): Promise<SandboxUsage> {
    return this.#for(id).sandboxUsage(id);
  }

  pauseSandbox(id: string): Promise<void> {
    return this.#for(id).pauseSandbox(id);
  }

  resumeSandbox(id: string): Promise<void> {
    return this.#for(id).resumeSandbox(id);
  }

  quiesceSandbox(id: string, opts: { endProcesses: boolean }): Promise<EdgeQuiesce> {
    return this.#for(id).quiesceSandbox(id, opts);
  }

  setNetwork(id: string, policy: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    return this.#for(id).setNetwork(id, policy);
  }

  getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    return this.#for(id).getNetwork(id);
  }

  snapshotSandbox(
    id: string,
    opts?: { scrub?: string[]; signal?: AbortSignal; memory?: boolean; portable?: boolean },
  ): Promise<EdgeSnapshot> {
    return this.#for(id).snapshotSandbox(id, opts);
  }

  openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    return this.#for(id).openPty(id, req);
  }

  openPort(id: string, port: number): Promise<Duplex> {
    return this.#for(id).openPort(id, port);
  }

  readFile(id: string, path: string, maxBytes: number, opts?: FileCallOptions): Promise<Buffer> {
    return this.#for(id).readFile(id, path, maxBytes, opts);
  }

  writeFile(id: string, path: string, data: Buffer, mode: number, opts?: WriteFileOptions): Promise<number> {
    return this.#for(id).writeFile(id, path, data, mode, opts);
  }

  statPath(id: string, path: string, opts?: StatOptions): Promise<FileStat> {
    return this.#for(id).statPath(id, path, opts);
  }

  listDir(id: string, path: string, opts?: StatOptions): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return this.#for(id).listDir(id, path, opts);
  }

  makeDir(id: string, path: string, parents: boolean, opts?: FileCallOptions): Promise<void> {
    return this.#for(id).makeDir(id, path, parents, opts);
  }

  removePath(id: string, path: string, recursive: boolean, opts?: FileCallOptions): Promise<void> {
    return this.#for(id).removePath(id, path, recursive, opts);
  }

  renamePath(id: string, from: string, to: string, opts?: FileCallOptions): Promise<void> {
    return this.#for(id).renamePath(id, from, to, opts);
  }

  uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    return this.#for(id).uploadTar(id, dir, body);
  }

  downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    return this.#for(id).downloadTar(id, path);
  }
}
