import { randomBytes } from 'node:crypto';
import { totalmem } from 'node:os';
import type { Logger } from 'pino';
import type { CreateSandboxRequest, ExecRequest, ExecResult, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import type { EdgeApi, EdgeInfo, SandboxLimits } from '../edge/edge-api.js';
import type { ImageStore } from '../image/image-store.js';
import type { StateStore } from './state-store.js';

export const DEFAULT_LIMITS: SandboxLimits = { cpu: 1, memoryMiB: 512, pids: 512 };

/** `sb-<edge>-<random>`: the edge is in the id, so routing a call needs no lookup. */
export function newSandboxId(edge: string): string {
  return `sb-${edge}-${randomBytes(8).readBigUInt64BE().toString(36).padStart(13, '0')}`;
}

export function edgeOf(id: string): string | undefined {
  return /^sb-([a-z0-9]{1,32})-[a-z0-9]+$/.exec(id)?.[1];
}

/**
 * The control plane's logic, apart from HTTP: validates against images and limits, places
 * sandboxes on edges, keeps the state store in step with the edges. It reaches edges only
 * through EdgeApi and never touches an edge's files.
 */
export class ControlPlane {
  readonly #edges = new Map<string, EdgeApi>();

  constructor(
    private readonly store: StateStore,
    private readonly images: ImageStore,
    private readonly log: Logger,
  ) {}

  addEdge(id: string, edge: EdgeApi): void {
    this.#edges.set(id, edge);
  }

  /** Brings the store in line with what an edge actually runs (after either restarted). */
  async reconcile(edgeId: string): Promise<{ lost: string[]; orphans: string[] }> {
    const edge = this.#edge(edgeId);
    const onEdge = new Set((await edge.listSandboxes()).map((s) => s.id));
    const lost: string[] = [];
    for (const s of this.store.listSandboxes({ edge: edgeId })) {
      if ((s.status === 'running' || s.status === 'creating') && !onEdge.has(s.id)) {
        this.store.setStatus(s.id, 'failed', 'lost: the edge no longer has this sandbox (it was removed while dsec was down)');
        lost.push(s.id);
      }
      if (s.status === 'creating' && onEdge.has(s.id)) this.store.setStatus(s.id, 'running');
      onEdge.delete(s.id);
    }
    // Sandboxes no caller was ever told about: kill them rather than leak them.
    const orphans = [...onEdge];
    for (const id of orphans) await edge.killSandbox(id).catch(() => undefined);
    if (lost.length || orphans.length) this.log.warn({ edge: edgeId, lost, orphans }, 'reconciled state store with edge');
    return { lost, orphans };
  }

  #edge(id: string): EdgeApi {
    const e = this.#edges.get(id);
    if (!e) throw new ApiError('INTERNAL', `edge ${id} is not registered`);
    return e;
  }

  /** Placement: the registered edge with the most free slots. */
  async #place(): Promise<string> {
    let best: { id: string; free: number } | undefined;
    for (const [id, edge] of this.#edges) {
      const info = await edge.info();
      const free = info.maxSandboxes - info.sandboxes;
      if (free > 0 && (!best || free > best.free)) best = { id, free };
    }
    if (!best) throw new ApiError('CAPACITY_EXCEEDED', 'every edge is full; kill sandboxes or add nodes');
    return best.id;
  }

  limitsFor(req: CreateSandboxRequest): SandboxLimits {
    const limits = { ...DEFAULT_LIMITS, ...req.resources };
    const hostMiB = Math.floor(totalmem() / (1 << 20));
    if (limits.memoryMiB > hostMiB) {
      throw new ApiError('INVALID_REQUEST', `resources.memoryMiB ${limits.memoryMiB} is more than this host has (${hostMiB} MiB)`, {
        field: 'resources.memoryMiB',
      });
    }
    return limits;
  }

  async create(req: CreateSandboxRequest): Promise<SandboxInfo> {
    const imageId = this.images.resolve(req.image);
    const manifest = imageId && this.images.get(imageId);
    if (!imageId || !manifest) {
      throw new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(req.image)}; list images with \`dsec image ls\` or build one with \`dsec image build busybox\``, {
        image: req.image,
      });
    }
    const limits = this.limitsFor(req);
    const edgeId = await this.#place();
    const info: SandboxInfo = {
      id: newSandboxId(edgeId),
      edge: edgeId,
      backend: 'container',
      status: 'creating',
      image: req.image,
      imageId,
      resources: limits,
      labels: req.labels ?? {},
      createdAt: new Date().toISOString(),
    };
    this.store.insertSandbox(info);
    try {
      await this.#edge(edgeId).createSandbox({ id: info.id, layers: manifest.layers, config: manifest.config, env: req.env ?? {}, limits });
    } catch (err) {
      if (err instanceof ApiError && err.code === 'CAPACITY_EXCEEDED') {
        this.store.deleteSandbox(info.id); // never accepted
        throw err;
      }
      const reason = err instanceof Error ? err.message : String(err);
      this.store.setStatus(info.id, 'failed', reason);
      if (err instanceof ApiError) {
        err.details['sandboxId'] = info.id;
        throw err;
      }
      throw new ApiError('SANDBOX_CREATE_FAILED', reason, { sandboxId: info.id });
    }
    this.store.setStatus(info.id, 'running');
    return { ...info, status: 'running' };
  }

  get(id: string): SandboxInfo {
    const s = this.store.getSandbox(id);
    if (!s) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id}`, { id });
    return s;
  }

  list(filter: { labels?: Record<string, string>; status?: SandboxStatus }): SandboxInfo[] {
    return this.store.listSandboxes(filter);
  }

  async kill(id: string): Promise<void> {
    const s = this.get(id);
    if (s.status === 'running' || s.status === 'creating') {
      try {
        await this.#edge(s.edge).killSandbox(id);
      } catch (err) {
        if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
      }
    }
    this.store.deleteSandbox(id);
  }

  #runningOn(id: string): EdgeApi {
    const s = this.get(id);
    if (s.status !== 'running') {
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}${s.reason ? `: ${s.reason}` : ''}`, { id, status: s.status });
    }
    return this.#edge(s.edge);
  }

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    return this.#runningOn(id).exec(id, req, signal);
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return this.#runningOn(id).readFile(id, path, maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    return this.#runningOn(id).writeFile(id, path, data, mode);
  }

  async nodes(): Promise<EdgeInfo[]> {
    return Promise.all([...this.#edges.values()].map((e) => e.info()));
  }

  /** Kills every sandbox (used by `dsec demo` cleanup and tests). */
  async killAll(): Promise<void> {
    await Promise.allSettled(this.store.listSandboxes().map((s) => this.kill(s.id)));
  }
}
