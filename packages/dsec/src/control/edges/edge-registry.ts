import type { Logger } from 'pino';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, EdgeHeartbeatInfo, EdgeInfo, SandboxLimits } from '../../edge/protocol/edge-api.js';
import { applyLayerSync, type LayerSync } from '../../edge/protocol/layer-delta.js';
import type { PlacementCandidate } from '../placement.js';
import type { StateStore } from '../state-store.js';
import { HttpEdgeClient } from './http-edge-client.js';

export type EdgeState = PlacementCandidate['state'];

/** What an edge says about itself when it joins (and again after a control plane forgot it). */
export interface EdgeRegistration {
  id: string;
  url: string;
  pool: string;
  labels: Record<string, string>;
  cpuOvercommit: number;
  info: EdgeInfo;
}

interface EdgeEntry extends PlacementCandidate {
  api: EdgeApi;
  /** Unset for the in-process edge of `dsec up`. */
  url?: string;
  /** In-process edges cannot be lost: they live and die with the control plane. */
  local: boolean;
  lastSeen: number;
  /** Placed, create not answered yet: survives a heartbeat, unlike `pending`. */
  inflight: { count: number; cpu: number; memoryMiB: number; pids: number };
  /** The version of `info.cachedLayers` agreed with the edge (edge/protocol/layer-delta.ts). */
  layersVersion?: number | undefined;
  /** Known from the store after a control-plane restart: reconciled at its first report. */
  reconcileAtFirstReport?: boolean;
  /** A call to it ended with its outcome unknown, or a reconcile failed: reconciled at its next report. */
  reconcileAtNextReport?: boolean;
}

const zero = (): EdgeEntry['pending'] => ({ count: 0, cpu: 0, memoryMiB: 0, pids: 0 });

/** An edge with no heartbeat for this long is lost (the bound: 10 s at most). */
export const DEFAULT_EDGE_LOST_AFTER_MS = 10_000;

export interface EdgeRegistryOptions {
  store: Pick<StateStore, 'edges' | 'leases'>;
  token: string;
  log: Logger;
  lostAfterMs?: number;
  /**
   * This control-plane replica's name. Replicas on one store share their edges through it: each
   * reads the others' joins and heartbeats at every tick, and the one holding the lease
   * `edge-watcher` marks silent edges lost, so that happens once.
   */
  replicaId?: string;
}

/** How long the edge watcher's lease lasts without renewal (it renews every tick). */
const WATCHER_LEASE_MS = 5_000;

/**
 * The control plane's edges: how to reach each, its pool and labels, and its last reported
 * capacity. Remote edges report every second (heartbeats); the in-process edge is asked. An edge
 * silent for `lostAfterMs` is marked lost (onLost), and back when it reports again (onBack). The
 * list is kept in the state store too, so a restarted control plane knows where its sandboxes run
 * before the first heartbeat arrives.
 */
export class EdgeRegistry {
  readonly #edges = new Map<string, EdgeEntry>();
  readonly lostAfterMs: number;
  onLost: (id: string, why: string) => Promise<void> = async () => undefined;
  onBack: (id: string) => Promise<void> = async () => undefined;

  constructor(private readonly opts: EdgeRegistryOptions) {
    this.lostAfterMs = opts.lostAfterMs ?? DEFAULT_EDGE_LOST_AFTER_MS;
  }

  /** A registry with the edges the store knows (from before a restart). */
  static async open(opts: EdgeRegistryOptions): Promise<EdgeRegistry> {
    const registry = new EdgeRegistry(opts);
    await registry.#load();
    return registry;
  }

  /** Edges known before a restart: reachable as before; they get a full timeout to report. */
  async #load(): Promise<void> {
    const opts = this.opts;
    for (const e of await opts.store.edges.list()) {
      this.#edges.set(e.id, {
        id: e.id,
        pool: e.pool,
        labels: e.labels,
        state: e.state === 'lost' ? 'lost' : e.state,
        info: e.info,
        layersVersion: e.layersVersion,
        pending: zero(),
        inflight: zero(),
        cpuOvercommit: e.cpuOvercommit,
        api: new HttpEdgeClient(e.id, e.url, opts.token),
        url: e.url,
        local: false,
        lastSeen: Date.now(),
        reconcileAtFirstReport: true,
      });
    }
  }

  /** The in-process edge of `dsec up`: placed on like any other, never lost. */
  async addLocal(
    id: string,
    api: EdgeApi,
    opts: { pool?: string; labels?: Record<string, string>; cpuOvercommit?: number } = {},
  ): Promise<void> {
    this.#edges.set(id, {
      id,
      pool: opts.pool ?? 'default',
      labels: opts.labels ?? {},
      state: 'ready',
      info: await api.info(),
      pending: zero(),
      inflight: zero(),
      cpuOvercommit: opts.cpuOvercommit ?? DEFAULT_CPU_OVERCOMMIT,
      api,
      local: true,
      lastSeen: Date.now(),
    });
  }

  /** A remote edge joins (or rejoins after a restart of either side). */
  async register(reg: EdgeRegistration): Promise<{ state: EdgeState }> {
    const prev = this.#edges.get(reg.id);
    if (prev?.local) throw new ApiError('INVALID_REQUEST', `edge id ${reg.id} is this control plane's own edge`, { id: reg.id });
    // An edge that registers again has restarted (or this control plane forgot it): what it runs
    // now is what its start adopted, which need not be what the store says. A create it finished
    // as it was killed, never answered, is failed here and runs there; reconcile kills it.
    const rejoined = prev !== undefined;
    const state: EdgeState = prev?.state === 'draining' ? 'draining' : 'ready';
    const entry: EdgeEntry = {
      id: reg.id,
      pool: reg.pool,
      labels: reg.labels,
      state,
      info: reg.info,
      // A join brings the whole list and no version: the next heartbeat agrees one.
      layersVersion: undefined,
      pending: zero(),
      inflight: prev?.inflight ?? zero(),
      cpuOvercommit: reg.cpuOvercommit,
      api: prev && prev.url === reg.url ? prev.api : new HttpEdgeClient(reg.id, reg.url, this.opts.token),
      url: reg.url,
      local: false,
      lastSeen: Date.now(),
    };
    this.#edges.set(reg.id, entry);
    await this.#persist(entry);
    this.opts.log.info({ edge: reg.id, url: reg.url, pool: reg.pool, rejoined: !!prev }, 'edge joined');
    if (rejoined) this.#reconcile(reg.id);
    return { state };
  }

  /**
   * A heartbeat: the edge's capacity now, and its cached layers as a whole list or as changes
   * since the version this control plane holds (`sync`); answers the layers version now held
   * (none when a delta did not apply: the edge then sends the whole list). Unknown edges must
   * register first (404).
   */
  async heartbeat(id: string, info: EdgeHeartbeatInfo, sync?: LayerSync): Promise<{ state: EdgeState; layersVersion?: number }> {
    const e = this.#edges.get(id);
    if (!e || e.local) throw new ApiError('EDGE_NOT_FOUND', `edge ${id} is not registered here; register first`, { id });
    const before = e.layersVersion;
    const next = applyLayerSync(e.info.cachedLayers, e.layersVersion, info.cachedLayers, sync);
    e.info = { ...info, cachedLayers: next?.layers ?? e.info.cachedLayers };
    e.layersVersion = next?.version;
    e.pending = { ...e.inflight };
    e.lastSeen = Date.now();
    // Every replica reads it from there: heartbeats may come to any of them. The layers are
    // written only when they, or their version, changed.
    const layersMoved = next !== undefined && (next.changed || next.version !== before);
    await this.opts.store.edges.touch(id, e.info, e.lastSeen, layersMoved ? { version: next.version } : undefined);
    if (e.state === 'lost' || e.reconcileAtFirstReport) {
      if (e.state === 'lost') this.opts.log.warn({ edge: id }, 'lost edge is back');
      e.state = e.state === 'lost' ? 'ready' : e.state;
      e.reconcileAtFirstReport = false;
      e.reconcileAtNextReport = false;
      await this.#persist(e);
      this.#reconcile(id);
    } else if (e.reconcileAtNextReport) {
      e.reconcileAtNextReport = false;
      this.#reconcile(id);
    }
    return { state: e.state, ...(e.layersVersion !== undefined ? { layersVersion: e.layersVersion } : {}) };
  }

  /**
   * A call to edge `id` ended without its answer (the connection broke, or it timed out, after the
   * request was sent): what it did is unknown, e.g. a create may have finished there after its
   * row was failed. Called once the row is settled; the edge is reconciled at its next report
   * (register or heartbeat) so what it runs and the store agree again. A backstop: the create
   * also kills its sandbox on the edge itself (sandbox-creation.ts), which does not wait for a
   * report to this replica. Kept in this replica's memory: another replica's heartbeats do not
   * consume it.
   */
  reconcileAtNextReport(id: string): void {
    const e = this.#edges.get(id);
    if (e && !e.local) e.reconcileAtNextReport = true;
  }

  /** Reconciles in the background: a heartbeat is answered at once, whatever the edge runs. */
  #reconcile(id: string): void {
    this.onBack(id).catch((err: unknown) => {
      // Tried again at its next report: until then the store and the edge may disagree.
      this.reconcileAtNextReport(id);
      this.opts.log.error({ err, edge: id }, 'reconciling an edge that reported again failed; trying again at its next report');
    });
  }

  /** Asks the in-process edges for their facts now (they send no heartbeats). */
  async refreshLocal(now = Date.now()): Promise<void> {
    for (const e of this.#edges.values()) {
      if (!e.local) continue;
      e.info = await e.api.info();
      e.pending = { ...e.inflight };
      e.lastSeen = now;
    }
  }

  /**
   * Called on the control plane's clock: refreshes in-process edges, reads what other replicas
   * learned (joins, heartbeats, losses, drains) from the store, and, on the replica holding the
   * watcher's lease, marks silent edges lost.
   */
  async tick(now = Date.now()): Promise<void> {
    await this.refreshLocal(now);
    await this.#readStore(now);
    if (!(await this.opts.store.leases.acquire('edge-watcher', this.#replica, WATCHER_LEASE_MS, now))) return;
    for (const e of this.#edges.values()) {
      if (e.local) continue;
      if (e.state !== 'lost' && now - e.lastSeen > this.lostAfterMs) {
        e.state = 'lost';
        await this.#persist(e);
        const why = `edge ${e.id} sent no heartbeat for ${Math.round((now - e.lastSeen) / 1000)} s`;
        this.opts.log.error({ edge: e.id }, why);
        await this.onLost(e.id, why);
        if (e.api instanceof HttpEdgeClient) e.api.abortInflight();
      }
    }
  }

  /** Starts tick() every intervalMs; returns the stop function. */
  startWatcher(intervalMs = 1000): () => void {
    let busy = false;
    const timer = setInterval(() => {
      if (busy) return;
      busy = true;
      this.tick()
        .catch((err: unknown) => this.opts.log.error({ err }, 'edge watcher failed'))
        .finally(() => (busy = false));
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }

  async drain(id: string): Promise<EdgeState> {
    const e = this.#entry(id);
    e.state = 'draining';
    await this.#persist(e);
    return e.state;
  }

  /** A drained edge leaves: nothing runs on it any more. */
  async remove(id: string): Promise<void> {
    const e = this.#entry(id);
    if (e.local) throw new ApiError('INVALID_REQUEST', `edge ${id} is this control plane's own edge`, { id });
    this.#edges.delete(id);
    await this.opts.store.edges.delete(id);
  }

  #entry(id: string): EdgeEntry {
    const e = this.#edges.get(id);
    if (!e) throw new ApiError('EDGE_NOT_FOUND', `no edge ${id}; list them with GET /v1/nodes`, { id });
    return e;
  }

  has(id: string): boolean {
    return this.#edges.has(id);
  }

  state(id: string): EdgeState | undefined {
    return this.#edges.get(id)?.state;
  }

  /** How to reach an edge. Calls to a lost edge fail fast with EDGE_UNAVAILABLE. */
  api(id: string): EdgeApi {
    const e = this.#entry(id);
    if (e.state === 'lost')
      throw new ApiError('EDGE_UNAVAILABLE', `edge ${id} is lost (no heartbeat for over ${this.lostAfterMs / 1000} s)`, {
        edge: id,
        // Refused before anything was sent to the edge: the call may be retried as it is.
        retryable: true,
      });
    return e.api;
  }

  /** Whether `id` is this control plane's own in-process edge (`dsec up`); unknown ids are not. */
  isLocal(id: string): boolean {
    return this.#edges.get(id)?.local === true;
  }

  /** The same api(), for reconciling an edge that has just come back. */
  apiEvenIfLost(id: string): EdgeApi {
    return this.#entry(id).api;
  }

  candidates(): PlacementCandidate[] {
    return [...this.#edges.values()];
  }

  ids(): string[] {
    return [...this.#edges.keys()];
  }

  /** Counts a placement until the edge's next heartbeat shows it (and until the create answers). */
  reserve(id: string, l: SandboxLimits): void {
    const e = this.#edges.get(id);
    if (!e) return;
    for (const b of [e.pending, e.inflight]) {
      b.count++;
      b.cpu += l.cpu;
      b.memoryMiB += l.memoryMiB;
      b.pids += l.pids;
    }
  }

  release(id: string, l: SandboxLimits, failed: boolean): void {
    const e = this.#edges.get(id);
    if (!e) return;
    const bs = failed ? [e.pending, e.inflight] : [e.inflight];
    for (const b of bs) {
      b.count = Math.max(0, b.count - 1);
      b.cpu = Math.max(0, b.cpu - l.cpu);
      b.memoryMiB = Math.max(0, b.memoryMiB - l.memoryMiB);
      b.pids = Math.max(0, b.pids - l.pids);
    }
  }

  /** Every edge with its placement facts, for GET /v1/nodes. */
  describe(): {
    id: string;
    url?: string;
    pool: string;
    labels: Record<string, string>;
    state: EdgeState;
    lastSeenAt: string;
    info: EdgeInfo;
    cpuOvercommit: number;
  }[] {
    return [...this.#edges.values()].map((e) => {
      const d: ReturnType<EdgeRegistry['describe']>[number] = {
        id: e.id,
        pool: e.pool,
        labels: e.labels,
        state: e.state,
        lastSeenAt: new Date(e.lastSeen).toISOString(),
        info: e.info,
        cpuOvercommit: e.cpuOvercommit,
      };
      if (e.url) d.url = e.url;
      return d;
    });
  }

  async #persist(e: EdgeEntry): Promise<void> {
    if (e.local || !e.url) return;
    await this.opts.store.edges.upsert({
      id: e.id,
      url: e.url,
      pool: e.pool,
      labels: e.labels,
      state: e.state,
      info: e.info,
      cpuOvercommit: e.cpuOvercommit,
      lastSeen: e.lastSeen,
      layersVersion: e.layersVersion,
    });
  }

  get #replica(): string {
    return this.opts.replicaId ?? 'only';
  }

  /** Folds in what the store knows that this replica did not see itself (other replicas' edges). */
  async #readStore(now: number): Promise<void> {
    const stored = await this.opts.store.edges.list((id) => this.#edges.get(id)?.layersVersion);
    const ids = new Set(stored.map((e) => e.id));
    for (const [id, e] of this.#edges) if (!e.local && !ids.has(id)) this.#edges.delete(id); // removed at another replica
    for (const r of stored) {
      const e = this.#edges.get(r.id);
      if (!e) {
        this.#edges.set(r.id, {
          id: r.id,
          pool: r.pool,
          labels: r.labels,
          state: r.state,
          info: r.info,
          layersVersion: r.layersVersion,
          pending: zero(),
          inflight: zero(),
          cpuOvercommit: r.cpuOvercommit,
          api: new HttpEdgeClient(r.id, r.url, this.opts.token),
          url: r.url,
          local: false,
          lastSeen: r.lastSeen || now,
        });
        continue;
      }
      if (e.local) continue;
      if ((r.lastSeen ?? 0) > e.lastSeen) {
        e.lastSeen = r.lastSeen!;
        e.info = r.layersUnchanged ? { ...r.info, cachedLayers: e.info.cachedLayers } : r.info;
        e.layersVersion = r.layersVersion;
        e.pending = { ...e.inflight };
      }
      // Another replica marked it lost, saw it back (and reconciled it), or drains it. An edge
      // loaded at start that has not reported here yet still takes a loss: the replica holding the
      // watcher's lease decides that, and this one would otherwise place on a dead edge for ever.
      if (r.state !== e.state && (!e.reconcileAtFirstReport || r.state === 'lost')) e.state = r.state;
      if (r.url !== e.url) {
        e.url = r.url;
        e.api = new HttpEdgeClient(r.id, r.url, this.opts.token);
      }
    }
  }
}

/** No cap on CPU limits by default: they are CFS ceilings, and idle sandboxes use next to none. */
export const DEFAULT_CPU_OVERCOMMIT = 0;
