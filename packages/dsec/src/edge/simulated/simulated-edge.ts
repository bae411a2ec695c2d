import pino, { type Logger } from 'pino';
import { createEach } from '../protocol/create-each.js';
import {
  type EdgeApi,
  type GroupCreateListener,
  type EdgeCreateOutcome,
  type EdgeCreateRequest,
  type EdgeInfo,
  type EdgeSandbox,
  type TerminalChannel,
} from '../protocol/edge-api.js';
import { ApiError } from '../../api-error.js';
import type { App } from '../../http/app.js';
import { joinCluster, type JoinedEdge } from '../join-loop.js';
import { NodeBudget } from '../node/node-budget.js';
import { EDGE_PROTOCOL_VERSION } from '../protocol/schemas.js';
import { buildEdgeServer } from '../server/edge-server.js';

/**
 * The node a simulated edge pretends to be. Large on purpose: the benchmark measures the control
 * plane, so the simulated nodes must never be what fills up.
 */
export interface SimulatedNode {
  cpus: number;
  memoryBytes: number;
  maxSandboxes: number;
  /** As `dsec edge --cpu-overcommit`: reported at join and enforced at create (edge/node/node-budget.ts). @default 0 (no cap) */
  cpuOvercommit?: number;
}

export const SIMULATED_NODE: SimulatedNode = { cpus: 64, memoryBytes: 512 * 1024 ** 3, maxSandboxes: 100_000 };

/** What an idle sandbox costs a real node (measured: ~1.2 MiB kernel memory, 2 processes), charged so placement sees the node fill. */
const IDLE_SANDBOX_BYTES = 1.2 * 1024 * 1024;
const IDLE_SANDBOX_PIDS = 2;

/**
 * A SIMULATED edge, for measuring the control plane's own throughput and nothing else: it speaks
 * the edge protocol (the same HTTP server, schemas and cluster-token auth as `dsec edge`), but a
 * create only records the sandbox in memory and answers at once: no crun, no layers, no network.
 * info, list, create and kill work; every other call answers INVALID_REQUEST saying this is a
 * simulated edge. It admits what fits its slots and CPU cap with the real edge's NodeBudget
 * (CAPACITY_EXCEEDED beyond), as a real edge does.
 */
export class SimulatedEdge implements EdgeApi {
  readonly #sandboxes = new Map<string, EdgeSandbox & { cpu: number; memoryMiB: number; pids: number }>();
  /**
   * The sum of the held sandboxes' cpu limits, kept as they come and go: every create asks the
   * budget for it, and summing the map there made a batch of 32,000 quadratic (a third of the
   * simulated edges' CPU in `dsec bench cluster`'s profile).
   */
  #cpuCommitted = 0;
  readonly #layers = new Set<string>();
  #state: EdgeInfo['state'] = 'running';
  /** Creates accepted since start (kills do not lower it). */
  created = 0;
  /** Kill requests per sandbox id (tests count them: a sandbox expired twice would show 2). */
  readonly kills = new Map<string, number>();
  /** A create's time on this node (0: answered at once); tests slow a batch down with it. */
  createDelayMs = 0;

  readonly #budget: NodeBudget;

  constructor(
    readonly id: string,
    readonly node: SimulatedNode = SIMULATED_NODE,
  ) {
    this.#budget = new NodeBudget(id, node.cpuOvercommit ?? 0, () => ({
      sandboxes: this.#sandboxes.size,
      maxSandboxes: node.maxSandboxes,
      cpuCommitted: this.#cpuCommitted,
      cpus: node.cpus,
    }));
  }

  async info(): Promise<EdgeInfo> {
    let cpu = 0;
    let mem = 0;
    let pids = 0;
    for (const s of this.#sandboxes.values()) {
      cpu += s.cpu;
      mem += s.memoryMiB;
      pids += s.pids;
    }
    const n = this.#sandboxes.size;
    return {
      id: this.id,
      protocol: EDGE_PROTOCOL_VERSION,
      version: 'simulated',
      state: this.#state,
      sandboxes: n,
      maxSandboxes: this.node.maxSandboxes,
      capacity: {
        cpus: this.node.cpus,
        memoryBytes: this.node.memoryBytes,
        memoryAvailableBytes: Math.max(0, Math.round(this.node.memoryBytes - n * IDLE_SANDBOX_BYTES)),
        cpuCommitted: cpu,
        memoryCommittedMiB: mem,
        pidsCommitted: pids,
        pidMax: 4_194_304,
        pidsInUse: 200 + n * IDLE_SANDBOX_PIDS,
      },
      layerCache: { entries: this.#layers.size, bytes: 0, chargedBytes: 0, budgetBytes: 0, mounted: 0, evictions: 0, overBudget: false },
      cachedLayers: [...this.#layers],
    };
  }

  /** Creates still being made: a kill waits for one, as a real edge's does. */
  readonly #making = new Map<string, Promise<unknown>>();

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    // A create of an id it holds answers with that sandbox (a retried request), full or not.
    const release = this.#sandboxes.has(req.id) || this.#making.has(req.id) ? () => {} : this.#budget.hold(req.limits);
    const made = this.#create(req).finally(release);
    this.#making.set(
      req.id,
      made.catch(() => undefined),
    );
    try {
      return await made;
    } finally {
      this.#making.delete(req.id);
    }
  }

  async #create(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    if (this.createDelayMs > 0) await new Promise((r) => setTimeout(r, this.createDelayMs));
    const known = this.#sandboxes.get(req.id);
    if (known) return strip(known);
    if (this.#state !== 'running')
      throw new ApiError('CAPACITY_EXCEEDED', `simulated edge ${this.id} is ${this.#state}`, { edge: this.id });
    for (const l of req.layers) this.#layers.add(l);
    const s = {
      id: req.id,
      status: 'running' as const,
      pid: 0,
      createdAt: new Date().toISOString(),
      cpu: req.limits.cpu,
      memoryMiB: req.limits.memoryMiB,
      pids: req.limits.pids,
    };
    this.#sandboxes.set(req.id, s);
    this.#cpuCommitted += s.cpu;
    this.created++;
    return strip(s);
  }

  createSandboxes(reqs: EdgeCreateRequest[], listener?: GroupCreateListener): Promise<EdgeCreateOutcome[]> {
    return createEach((r) => this.createSandbox(r), reqs, reqs.length, listener);
  }

  /** Creates it is working on now (tests: a create has reached it, not only its row the store). */
  get making(): number {
    return this.#making.size;
  }

  /** Sandboxes it holds now. */
  get size(): number {
    return this.#sandboxes.size;
  }

  async killSandbox(id: string): Promise<void> {
    await this.#making.get(id);
    this.kills.set(id, (this.kills.get(id) ?? 0) + 1);
    const s = this.#sandboxes.get(id);
    // Empty, the sum starts over at 0, so the rounding of many fractional adds and subtracts does not pile up.
    if (s && this.#sandboxes.delete(id)) this.#cpuCommitted = this.#sandboxes.size === 0 ? 0 : this.#cpuCommitted - s.cpu;
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    return [...this.#sandboxes.values()].map(strip);
  }

  /** Stops taking sandboxes, as a real edge does while it shuts down. */
  stop(): void {
    this.#state = 'stopped';
  }

  #unsupported(what: string): never {
    throw new ApiError(
      'INVALID_REQUEST',
      `edge ${this.id} is a simulated edge (dsec bench cluster): it records sandboxes but runs nothing, so ${what} is not available`,
      {
        edge: this.id,
        simulated: true,
      },
    );
  }

  exec(): never {
    return this.#unsupported('exec');
  }
  execStream(): AsyncIterable<never> {
    return this.#unsupported('exec');
  }
  startProcess(): never {
    return this.#unsupported('processes');
  }
  listProcesses(): never {
    return this.#unsupported('processes');
  }
  processOutput(): never {
    return this.#unsupported('processes');
  }
  waitProcess(): never {
    return this.#unsupported('processes');
  }
  signalProcess(): never {
    return this.#unsupported('processes');
  }
  writeProcessStdin(): never {
    return this.#unsupported('processes');
  }
  openSession(): never {
    return this.#unsupported('sessions');
  }
  listSessions(): never {
    return this.#unsupported('sessions');
  }
  sessionExec(): never {
    return this.#unsupported('sessions');
  }
  closeSession(): never {
    return this.#unsupported('sessions');
  }
  sandboxUsage(): never {
    return this.#unsupported('usage');
  }
  pauseSandbox(): never {
    return this.#unsupported('pause');
  }
  resumeSandbox(): never {
    return this.#unsupported('resume');
  }
  quiesceSandbox(): never {
    return this.#unsupported('migration');
  }
  setNetwork(): never {
    return this.#unsupported('network');
  }
  getNetwork(): never {
    return this.#unsupported('network');
  }
  snapshotSandbox(): never {
    return this.#unsupported('snapshot');
  }
  openPty(): Promise<TerminalChannel> {
    return this.#unsupported('a terminal');
  }
  openPort(): never {
    return this.#unsupported('ports');
  }
  createVolume(): never {
    return this.#unsupported('volumes');
  }
  deleteVolume(): never {
    return this.#unsupported('volumes');
  }
  volumeUsage(): never {
    return this.#unsupported('volumes');
  }
  readFile(): never {
    return this.#unsupported('files');
  }
  writeFile(): never {
    return this.#unsupported('files');
  }
  statPath(): never {
    return this.#unsupported('files');
  }
  listDir(): never {
    return this.#unsupported('files');
  }
  makeDir(): never {
    return this.#unsupported('files');
  }
  removePath(): never {
    return this.#unsupported('files');
  }
  renamePath(): never {
    return this.#unsupported('files');
  }
  uploadTar(): never {
    return this.#unsupported('files');
  }
  downloadTar(): never {
    return this.#unsupported('files');
  }
}

function strip(s: EdgeSandbox): EdgeSandbox {
  return { id: s.id, status: s.status, pid: s.pid, createdAt: s.createdAt };
}

export interface SimulatedEdgeOptions {
  /** The control plane's URL and the cluster's join token. */
  join: string;
  token: string;
  id: string;
  /** Loopback address to listen on. @default 127.0.0.1 */
  host?: string;
  node?: SimulatedNode;
  /** The pool it joins. @default default */
  pool?: string;
  /** Node labels, besides simulated=true (placement.labels picks edges by them). */
  labels?: Record<string, string>;
  log?: Logger;
}

export interface RunningSimulatedEdge {
  id: string;
  url: string;
  edge: SimulatedEdge;
  /** The edge protocol's HTTP server (tests walk its routes). */
  server: App;
  close(): Promise<void>;
}

/** Serves a SimulatedEdge over the edge protocol's HTTP server (`dsec edge`'s) on a free loopback port. */
export async function serveSimulatedEdge(
  edge: SimulatedEdge,
  opts: { token: string; host?: string; log?: Logger },
): Promise<{ url: string; server: App }> {
  const log = opts.log ?? pino({ level: 'warn', base: undefined });
  const host = opts.host ?? '127.0.0.1';
  const server: App = await buildEdgeServer(edge, { token: opts.token, log: log.child({ edge: edge.id }) });
  try {
    await server.listen({ host, port: 0 });
  } catch (err) {
    await server.close();
    throw err;
  }
  const addr = server.server.address();
  return { url: `http://${host}:${typeof addr === 'object' && addr ? addr.port : 0}`, server };
}

/**
 * A SimulatedEdge served over the edge protocol and joined to the control plane exactly as
 * `dsec edge` joins (edge/join-loop.ts: same routes, same token, heartbeats every second).
 */
export async function startSimulatedEdge(opts: SimulatedEdgeOptions): Promise<RunningSimulatedEdge> {
  const log = opts.log ?? pino({ level: 'warn', base: undefined });
  const edge = new SimulatedEdge(opts.id, opts.node);
  const { url, server } = await serveSimulatedEdge(edge, { token: opts.token, log, ...(opts.host ? { host: opts.host } : {}) });
  let joined: JoinedEdge;
  try {
    joined = await joinCluster({
      join: opts.join,
      token: opts.token,
      id: opts.id,
      url,
      pool: opts.pool ?? 'default',
      labels: { ...opts.labels, simulated: 'true' },
      cpuOvercommit: opts.node?.cpuOvercommit ?? 0,
      info: () => edge.info(),
      log,
    });
  } catch (err) {
    await server.close();
    throw err;
  }
  let closing: Promise<void> | undefined;
  return {
    id: opts.id,
    url,
    edge,
    server,
    close() {
      // A second close waits for the first, as an edge daemon's does.
      closing ??= (async () => {
        edge.stop();
        await joined.stop();
        await server.close();
      })();
      return closing;
    },
  };
}
