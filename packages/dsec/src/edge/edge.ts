import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { ExecRequest, ExecResult } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import { CGROUP_PARENT, removeCgroupTree } from '../host/cgroups.js';
import { mountsUnder } from '../host/mounts.js';
import { ToolError } from '../host/run-tool.js';
import type { LayerStore } from '../image/layer-store.js';
import { Crun } from './crun.js';
import type { EdgeApi, EdgeCreateRequest, EdgeInfo, EdgeSandbox } from './edge-api.js';
import { execInSandbox } from './exec.js';
import { LayerMounts, tryUnmount } from './layer-mounts.js';
import { buildOciConfig } from './oci-config.js';
import { mountOverlay } from './overlay.js';
import { readFileInRoot, sandboxPath, writeFileInRoot } from './sandbox-files.js';
import { type SandboxRecord, SandboxRecords } from './sandbox-record.js';

export interface EdgeOptions {
  id: string;
  /** Node-local directory: layer mounts, sandbox dirs, crun state. */
  nodeDir: string;
  layers: LayerStore;
  maxSandboxes: number;
  log: Logger;
}

type EdgeState = 'starting' | 'running' | 'draining' | 'stopped';

/**
 * One per node: the final word on admission, and owner of the node's layer mounts and of every
 * sandbox's overlay, cgroups and crun container. All state lives on disk, so a restarted edge
 * adopts running sandboxes and cleans up what a crash left half-made.
 */
export class Edge implements EdgeApi {
  readonly id: string;
  readonly crun: Crun;
  readonly layerMounts: LayerMounts;
  readonly records: SandboxRecords;
  readonly #live = new Map<string, SandboxRecord>();
  /** Ids being created or killed, so a kill waits for a create to finish and vice versa. */
  readonly #busy = new Map<string, Promise<unknown>>();
  #state: EdgeState = 'starting';

  constructor(private readonly opts: EdgeOptions) {
    this.id = opts.id;
    mkdirSync(opts.nodeDir, { recursive: true });
    this.crun = new Crun(join(opts.nodeDir, 'crun'));
    this.layerMounts = new LayerMounts(opts.nodeDir, opts.layers);
    this.records = new SandboxRecords(join(opts.nodeDir, 'sandboxes'));
  }

  get state(): EdgeState {
    return this.#state;
  }

  /** Adopts sandboxes that are still running; removes whatever else a previous run left. */
  async start(): Promise<{ adopted: string[]; cleaned: string[] }> {
    const adopted: string[] = [];
    const cleaned: string[] = [];
    const running = new Map((await this.crun.list()).map((c) => [c.id, c]));
    for (const { id, record } of this.records.scan()) {
      const c = running.get(id);
      if (record?.phase === 'running' && c?.status === 'running') {
        this.#live.set(id, { ...record, pid: c.pid });
        adopted.push(id);
      } else {
        await this.#teardown(id, record?.layers ?? [], false);
        cleaned.push(id);
      }
      running.delete(id);
    }
    // Containers in our crun root without a sandbox dir: a crash between crun run and state save.
    for (const id of running.keys()) {
      await this.crun.delete(id);
      removeCgroupTree(`${CGROUP_PARENT}/${id}`);
      cleaned.push(id);
    }
    this.layerMounts.reconcile([...this.#live.values()].map((r) => r.layers));
    this.#state = 'running';
    if (adopted.length || cleaned.length) this.opts.log.info({ adopted, cleaned }, 'edge reconciled sandboxes from disk');
    return { adopted, cleaned };
  }

  async info(): Promise<EdgeInfo> {
    return { id: this.id, sandboxes: this.#live.size, maxSandboxes: this.opts.maxSandboxes };
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    return [...this.#live.values()].map((r) => toEdgeSandbox(r));
  }

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    if (this.#state !== 'running') throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.id} is ${this.#state}, not accepting sandboxes`);
    if (this.#live.size + this.#busy.size >= this.opts.maxSandboxes) {
      throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.id} is full (${this.opts.maxSandboxes} sandboxes)`, { maxSandboxes: this.opts.maxSandboxes });
    }
    if (this.#live.has(req.id) || this.#busy.has(req.id) || existsSync(this.records.paths(req.id).dir)) {
      throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} already exists on edge ${this.id}`);
    }
    for (const layer of req.layers) {
      if (!this.opts.layers.has(layer)) throw new ApiError('IMAGE_NOT_FOUND', `layer ${layer} is not in the layer store`, { layer });
    }
    const work = this.#create(req);
    this.#busy.set(req.id, work);
    try {
      return await work;
    } finally {
      this.#busy.delete(req.id);
    }
  }

  async #create(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    const paths = this.records.paths(req.id);
    const record: SandboxRecord = {
      id: req.id,
      phase: 'creating',
      layers: req.layers,
      config: req.config,
      env: req.env,
      limits: req.limits,
      createdAt: new Date().toISOString(),
    };
    mkdirSync(paths.dir);
    mkdirSync(paths.scratch);
    this.records.save(record);
    const acquired: typeof req.layers = [];
    try {
      const lowers: string[] = [];
      for (const layer of req.layers) {
        lowers.push(await this.layerMounts.acquire(layer));
        acquired.push(layer);
      }
      mountOverlay(lowers, paths.upper, paths.work, paths.rootfs);
      writeFileSync(paths.config, JSON.stringify(buildOciConfig({ id: req.id, config: req.config, env: req.env, limits: req.limits })));
      record.pid = await this.crun.run(req.id, paths.dir, paths.crunLog, paths.pidFile);
      record.phase = 'running';
      this.records.save(record);
      this.#live.set(req.id, record);
      return toEdgeSandbox(record);
    } catch (err) {
      await this.#teardown(req.id, acquired, true);
      if (err instanceof ToolError) {
        throw new ApiError('SANDBOX_CREATE_FAILED', `crun could not start the sandbox: ${err.result.stderr.trim()}`, { tool: 'crun', stderr: err.result.stderr });
      }
      if (err instanceof ApiError) throw err;
      throw new ApiError('SANDBOX_CREATE_FAILED', `could not create the sandbox: ${(err as Error).message}`);
    }
  }

  async killSandbox(id: string): Promise<void> {
    const inflight = this.#busy.get(id);
    if (inflight) await inflight.catch(() => undefined);
    const record = this.#live.get(id);
    if (!record) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on edge ${this.id}`);
    this.#live.delete(id);
    const work = this.#teardown(id, record.layers, true);
    this.#busy.set(id, work);
    try {
      await work;
    } finally {
      this.#busy.delete(id);
    }
  }

  /** Removes everything of a sandbox, in reverse order of creation; safe on half-made ones. */
  async #teardown(id: string, layers: SandboxRecord['layers'], releaseLayers: boolean): Promise<void> {
    const paths = this.records.paths(id);
    await this.crun.delete(id);
    for (const m of mountsUnder(paths.dir).reverse()) tryUnmount(m.mountPoint);
    removeCgroupTree(`${CGROUP_PARENT}/${id}`);
    if (releaseLayers) for (const l of layers) this.layerMounts.release(l);
    rmSync(paths.dir, { recursive: true, force: true });
  }

  #running(id: string): SandboxRecord {
    const r = this.#live.get(id);
    if (!r) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on edge ${this.id}`);
    return r;
  }

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    const r = this.#running(id);
    return execInSandbox({ crun: this.crun, id, dir: this.records.paths(id).scratch, config: r.config, env: r.env }, req, signal);
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    const r = this.#running(id);
    return readFileInRoot(this.records.paths(id).rootfs, sandboxPath(path, r.config.cwd), maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    const r = this.#running(id);
    return writeFileInRoot(this.records.paths(id).rootfs, sandboxPath(path, r.config.cwd), data, mode);
  }

  /**
   * Stops accepting work. Sandboxes keep running (they outlive the edge process and are adopted
   * at the next start) unless `killAll`, which tears every one down and unmounts all layers.
   */
  async shutdown(opts: { killAll?: boolean } = {}): Promise<void> {
    this.#state = 'draining';
    await Promise.allSettled([...this.#busy.values()]);
    if (opts.killAll) {
      await Promise.allSettled([...this.#live.keys()].map((id) => this.killSandbox(id)));
      removeCgroupTree(CGROUP_PARENT);
    }
    this.#state = 'stopped';
  }
}

function toEdgeSandbox(r: SandboxRecord): EdgeSandbox {
  return { id: r.id, status: 'running', pid: r.pid ?? 0, createdAt: r.createdAt };
}
