import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { Logger } from 'pino';
import type { CreatePoolRequest, CreateSandboxRequest, PoolInfo, PoolSpec, SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { DEFAULT_LIMITS } from '../sandbox-ids.js';
import type { StateStore } from '../state-store.js';
import { POOL_READY_LABEL, refuseReservedLabels } from './reserved-labels.js';

/** Label of a sandbox that came from a pool (value: the pool), kept after the claim. */
export const POOL_LABEL = 'dsec.pool';

/**
 * A burst of claims is answered first and refilled after it: refill creates share the control
 * plane's event loop (and the node's cores) with the claims, and one started between two claims
 * delays the second by its synchronous work (back-to-back claims measured p50 ~11 ms against
 * ~4 ms for a claim from an idle pool). The refill starts once claims pause this long, and at
 * the latest REFILL_DEFER_MAX_MS after the first deferred claim, so a steady stream still refills.
 */
const REFILL_QUIET_MS = 50;
const REFILL_DEFER_MAX_MS = 250;

/** Refill creates in flight per pool: a burst of claims refills without flooding the edges. */
const REFILLS_AT_ONCE = 4;
/** How often pools are checked against the store (sandboxes killed or lost meanwhile). */
const SWEEP_MS = 1000;
/** After a refill create fails, the pool waits this long before trying again (the spec or the cluster is wrong, not the moment). */
const REFILL_BACKOFF_MS = 5000;
const KEPT_TIMES = 100;

/** What the pool service needs of the control plane (a narrow seam: creates go through the ordinary path). */
export interface PoolHost {
  create(req: CreateSandboxRequest, extraLabels: Record<string, string>): Promise<SandboxInfo>;
  checkSpec(req: CreateSandboxRequest): Promise<void>;
  kill(id: string): Promise<void>;
}

interface Pool {
  name: string;
  size: number;
  spec: PoolSpec;
  key: string;
  createdAt: string;
  /** Unclaimed sandbox ids, oldest first. */
  ready: string[];
  creating: number;
  /** Its refill creates in flight: a delete waits for them (each kills its sandbox once made). */
  refills: Set<Promise<void>>;
  claims: number;
  misses: number;
  refillFailures: number;
  lastRefillError?: string;
  refillMs: number[];
  claimMs: number[];
  backoffUntil: number;
  deleted: boolean;
  /** The refill deferred while claims keep coming (see REFILL_QUIET_MS), and when it must start at the latest. */
  deferred?: { timer: NodeJS.Timeout; latest: number };
}

/**
 * Warm pools: N ready sandboxes per pool, made through the ordinary create path (placed, stored,
 * reconciled like any other) and marked with POOL_READY_LABEL until a create claims one. A claim
 * is one conditional UPDATE of the row's labels (the store's pools.claimSandbox), so a sandbox is
 * claimed once, and a ready sandbox serves no call (ControlPlane refuses it until claimed), so a
 * claimed sandbox is never one another caller used. Pools live in the store; after a restart the
 * ready sandboxes that still run are the pool's again and the rest is refilled.
 */
export class WarmPools {
  readonly #pools = new Map<string, Pool>();
  /** Every unclaimed sandbox id, across pools: ControlPlane asks this on each call. */
  readonly #unclaimed = new Map<string, string>();
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  /** Refill creates in flight, awaited by stop() so a shutdown that kills everything misses none. */
  readonly #inflight = new Set<Promise<void>>();

  constructor(
    private readonly store: Pick<StateStore, 'pools' | 'sandboxes'>,
    private readonly host: PoolHost,
    private readonly log: Logger,
  ) {}

  /** Loads the pools, adopts their ready sandboxes that still run, kills those of pools gone, and starts refilling. */
  async start(): Promise<void> {
    for (const p of await this.store.pools.list()) this.#add(p.name, p.size, p.spec as PoolSpec, p.createdAt);
    for (const s of await this.store.sandboxes.list({ status: 'running' })) {
      const name = s.labels[POOL_READY_LABEL];
      if (name === undefined) continue;
      const pool = this.#pools.get(name);
      if (pool) this.#markReady(pool, s.id);
      else
        await this.host
          .kill(s.id)
          .catch((err: unknown) => this.log.error({ err, sandbox: s.id }, 'killing a ready sandbox of a deleted pool failed'));
    }
    // Ready sandboxes that were creating or paused at the restart are not usable as fresh: they go.
    for (const status of ['creating', 'paused'] as const) {
      for (const s of await this.store.sandboxes.list({ status, labels: {} })) {
        if (s.labels[POOL_READY_LABEL] !== undefined) await this.host.kill(s.id).catch(() => undefined);
      }
    }
    this.#timer = setInterval(() => void this.#sweep(), SWEEP_MS);
    this.#timer.unref();
    for (const p of this.#pools.values()) this.#refill(p);
  }

  /** Stops refilling and waits for refills in flight; the ready sandboxes stay for the next start (or go with killAll). */
  async stop(): Promise<void> {
    this.#stopped = true;
    for (const p of this.#pools.values()) if (p.deferred) clearTimeout(p.deferred.timer);
    if (this.#timer) clearInterval(this.#timer);
    await Promise.allSettled([...this.#inflight]);
  }

  async create(req: CreatePoolRequest): Promise<PoolInfo> {
    const { name, size, ...spec } = req;
    if (this.#pools.has(name))
      throw new ApiError('POOL_EXISTS', `pool ${name} exists; delete it first (DELETE /v1/pools/${name}, dsec pool rm ${name})`, { name });
    await this.host.checkSpec(spec);
    const createdAt = new Date().toISOString();
    await this.store.pools.insert({ name, size, spec, createdAt });
    const pool = this.#add(name, size, spec, createdAt);
    this.#refill(pool);
    return this.#info(pool);
  }

  list(): PoolInfo[] {
    return [...this.#pools.values()].map((p) => this.#info(p));
  }

  get(name: string): PoolInfo {
    return this.#info(this.#pool(name));
  }

  /**
   * Deletes a pool and kills its unclaimed sandboxes, those its refills in flight make included
   * (it answers once they are gone, so a list right after shows none); claimed ones are their callers'.
   */
  async delete(name: string): Promise<void> {
    const pool = this.#pool(name);
    pool.deleted = true;
    if (pool.deferred) clearTimeout(pool.deferred.timer);
    this.#pools.delete(name);
    await this.store.pools.delete(name);
    const ids = pool.ready.splice(0);
    for (const id of ids) this.#unclaimed.delete(id);
    await Promise.all(
      ids.map((id) =>
        this.host.kill(id).catch((err: unknown) => this.log.error({ err, sandbox: id }, 'killing a ready pool sandbox failed')),
      ),
    );
    await Promise.all([...pool.refills]);
  }

  /** The pool an unclaimed sandbox waits in, or undefined for every other sandbox. */
  unclaimedIn(id: string): string | undefined {
    return this.#unclaimed.get(id);
  }

  /**
   * A create served from a pool: the pool it names (whose spec it must match) or the one whose spec
   * it matches. Undefined when no pool applies or none has a ready sandbox (a miss, counted; the
   * caller then creates as usual and the pool refills).
   */
  /**
   * The pool a create would claim from (the one it names, or whose spec it matches), if any.
   * Every single create asks, so the reserved labels are refused here (a batch's, at its check).
   */
  poolFor(req: CreateSandboxRequest): string | undefined {
    refuseReservedLabels(req.labels);
    return (req.pool === undefined ? this.#matching(req) : this.#named(req))?.name;
  }

  /**
   * `project`: the claimed sandbox becomes that project's (docs/PROJECTS.md); `accessToken`: E2B's
   * envd token for it, when an E2B create claims it.
   */
  async claim(req: CreateSandboxRequest, project: string = DEFAULT_PROJECT, accessToken?: string): Promise<SandboxInfo | undefined> {
    refuseReservedLabels(req.labels);
    const pool = req.pool === undefined ? this.#matching(req) : this.#named(req);
    if (!pool) return undefined;
    const started = performance.now();
    const labels = { ...(req.labels ?? {}), [POOL_LABEL]: pool.name };
    for (;;) {
      const id = pool.ready.shift();
      if (id === undefined) break;
      this.#unclaimed.delete(id);
      const claimed = await this.store.pools.claimSandbox(
        id,
        { [POOL_READY_LABEL]: pool.name, [POOL_LABEL]: pool.name },
        {
          labels,
          ttlSeconds: req.ttlSeconds,
          idleTimeoutSeconds: req.idleTimeoutSeconds,
          onExpiry: req.onExpiry ?? 'stop',
          at: Date.now(),
          project,
          accessToken,
        },
      );
      if (!claimed) continue; // killed, lost or claimed elsewhere meanwhile: the next one
      const info = await this.store.sandboxes.get(id);
      if (!info) continue;
      pool.claims++;
      keep(pool.claimMs, performance.now() - started);
      this.#refillAfterBurst(pool);
      return info;
    }
    pool.misses++;
    this.#refill(pool);
    return undefined;
  }

  /** The labels a miss's on-demand create gets, so it shows which pool it was asked of. */
  static missLabels(req: CreateSandboxRequest): Record<string, string> {
    return req.pool === undefined ? {} : { [POOL_LABEL]: req.pool };
  }

  #named(req: CreateSandboxRequest): Pool {
    const pool = this.#pool(req.pool!);
    const { pool: _name, labels: _l, ttlSeconds: _t, idleTimeoutSeconds: _i, onExpiry: _o, ...spec } = req;
    const want = canonical(pool.spec);
    const got = canonical(spec);
    const differ = Object.keys({ ...want, ...got }).filter((k) => JSON.stringify(want[k]) !== JSON.stringify(got[k]));
    if (differ.length) {
      throw new ApiError(
        'INVALID_REQUEST',
        `the create names pool ${pool.name} but differs from its spec in ${differ.join(', ')}; send the pool's spec (GET /v1/pools/${pool.name}) or leave pool out`,
        {
          field: 'pool',
          differ,
        },
      );
    }
    return pool;
  }

  #matching(req: CreateSandboxRequest): Pool | undefined {
    if (this.#pools.size === 0) return undefined;
    const { pool: _name, labels: _l, ttlSeconds: _t, idleTimeoutSeconds: _i, onExpiry: _o, ...spec } = req;
    const key = JSON.stringify(canonical(spec));
    for (const p of this.#pools.values()) if (p.key === key) return p;
    return undefined;
  }

  #pool(name: string): Pool {
    const pool = this.#pools.get(name);
    if (!pool) throw new ApiError('POOL_NOT_FOUND', `no pool ${name}; list pools with GET /v1/pools (dsec pool ls)`, { name });
    return pool;
  }

  #add(name: string, size: number, spec: PoolSpec, createdAt: string): Pool {
    const pool: Pool = {
      name,
      size,
      spec,
      key: JSON.stringify(canonical(spec)),
      createdAt,
      ready: [],
      creating: 0,
      refills: new Set(),
      claims: 0,
      misses: 0,
      refillFailures: 0,
      refillMs: [],
      claimMs: [],
      backoffUntil: 0,
      deleted: false,
    };
    this.#pools.set(name, pool);
    return pool;
  }

  #markReady(pool: Pool, id: string): void {
    pool.ready.push(id);
    this.#unclaimed.set(id, pool.name);
  }

  /** Schedules the refill once claims pause (REFILL_QUIET_MS), never later than REFILL_DEFER_MAX_MS after the first. */
  #refillAfterBurst(pool: Pool): void {
    const now = Date.now();
    const latest = pool.deferred?.latest ?? now + REFILL_DEFER_MAX_MS;
    if (pool.deferred) clearTimeout(pool.deferred.timer);
    const timer = setTimeout(
      () => {
        pool.deferred = undefined;
        this.#refill(pool);
      },
      Math.max(0, Math.min(REFILL_QUIET_MS, latest - now)),
    );
    timer.unref();
    pool.deferred = { timer, latest };
  }

  /** Starts creates until ready + creating reaches the size (at most REFILLS_AT_ONCE in flight). */
  #refill(pool: Pool): void {
    if (this.#stopped || pool.deleted || Date.now() < pool.backoffUntil) return;
    while (pool.ready.length + pool.creating < pool.size && pool.creating < REFILLS_AT_ONCE) {
      pool.creating++;
      const started = performance.now();
      const done: Promise<void> = this.host
        .create({ ...pool.spec }, { [POOL_READY_LABEL]: pool.name, [POOL_LABEL]: pool.name })
        .then(
          async (info) => {
            keep(pool.refillMs, performance.now() - started);
            if (pool.deleted || this.#stopped) {
              if (pool.deleted) await this.host.kill(info.id).catch(() => undefined);
              return;
            }
            this.#markReady(pool, info.id);
          },
          (err: unknown) => {
            pool.refillFailures++;
            pool.lastRefillError = (err as Error).message;
            pool.backoffUntil = Date.now() + REFILL_BACKOFF_MS;
            this.log.warn({ pool: pool.name, err: (err as Error).message }, 'pool refill failed; retrying later');
          },
        )
        .finally(() => {
          this.#inflight.delete(done);
          pool.refills.delete(done);
          pool.creating--;
          this.#refill(pool);
        });
      this.#inflight.add(done);
      pool.refills.add(done);
    }
  }

  /** Drops ready sandboxes that were killed or lost meanwhile, then refills. */
  async #sweep(): Promise<void> {
    for (const pool of this.#pools.values()) {
      for (const id of [...pool.ready]) {
        const s = await this.store.sandboxes.get(id);
        if (s?.status === 'running' && s.labels[POOL_READY_LABEL] === pool.name) continue;
        pool.ready = pool.ready.filter((r) => r !== id);
        this.#unclaimed.delete(id);
      }
      this.#refill(pool);
    }
  }

  #info(p: Pool): PoolInfo {
    const info: PoolInfo = {
      name: p.name,
      size: p.size,
      spec: p.spec,
      ready: p.ready.length,
      creating: p.creating,
      claims: p.claims,
      misses: p.misses,
      refillFailures: p.refillFailures,
      createdAt: p.createdAt,
    };
    if (p.lastRefillError !== undefined) info.lastRefillError = p.lastRefillError;
    if (p.refillMs.length) {
      info.refillMsP50 = round(median(p.refillMs));
      info.refillMsLast = round(p.refillMs[p.refillMs.length - 1]!);
    }
    if (p.claimMs.length) info.claimMsP50 = round(median(p.claimMs));
    return info;
  }
}

/**
 * A spec with its defaults filled and keys in one order, so equal specs compare equal. Every
 * field of a create that shapes the sandbox is here: one left out would be dropped by a claim
 * (a create with `volumes` once matched a pool, got a sandbox without them, and skipped the
 * volume's project check). A pool has no volumes, so a create with any never matches one.
 */
function canonical(spec: PoolSpec & { volumes?: unknown[] }): Record<string, unknown> {
  return sortKeys({
    volumes: spec.volumes ?? [],
    backend: spec.backend ?? 'container',
    image: spec.image,
    resources: { ...DEFAULT_LIMITS, ...spec.resources },
    layers: spec.layers ?? [],
    env: spec.env ?? {},
    network: spec.network ?? { mode: 'none' },
    placement: spec.placement ?? {},
  }) as Record<string, unknown>;
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object')
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]),
    );
  return v;
}

function keep(list: number[], ms: number): void {
  list.push(ms);
  if (list.length > KEPT_TIMES) list.shift();
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
