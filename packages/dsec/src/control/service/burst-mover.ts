import type { Logger } from 'pino';
import type { CreateSandboxRequest, SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import { poolUtilisation, type PlacementCandidate } from '../placement.js';
import type { StateStore } from '../state-store.js';
import { SYSTEM } from './callers.js';
import type { MigrationService, MoveCause } from './migration.js';

/** How often the pools are looked at. */
export const BURST_CHECK_MS = 5_000;
/** Moves per pool and look: a pool sheds load over a few looks, its edges' reports catching up in between. */
const MOVES_PER_CHECK = 4;
/** A sandbox is idle, and a candidate to move, once nothing has been called on it for this long. */
const IDLE_MS = 5_000;
/** Sandboxes come back only while their pool stays this far under the threshold (no moving back and forth). */
const RETURN_MARGIN = 0.1;

export interface BurstOptions {
  /** The pool that takes burstable sandboxes (an edge joins it with `--pool`). */
  pool: string;
  /** A pool above this share of its capacity (placement.ts poolUtilisation) sheds burstable sandboxes. */
  threshold: number;
  /** Bring sandboxes back from the burst pool when their own pool has room again. */
  returnHome: boolean;
}

/**
 * Bursting as DSec does it: a pool above its threshold sends new burstable creates to the burst
 * pool (SandboxCreation.place) and, here, moves its idle burstable sandboxes there (created with
 * `placement.burst`), the longest idle first, until it is back under; with `returnHome`, they
 * come back once their pool has room again. One replica looks (the holder of the `burst` lease);
 * every move goes through MigrationService (in the trajectory, in /metrics). A sandbox that cannot
 * move now (a container running a command) is passed over until the next look.
 */
export class BurstMover {
  constructor(
    private readonly deps: {
      store: StateStore;
      edges: EdgeRegistry;
      migration: MigrationService;
      log: Logger;
      replicaId: string;
      burst: BurstOptions;
    },
  ) {}

  /** One look at every pool; the moves made, by id. */
  async check(now = Date.now()): Promise<{ out: string[]; back: string[] }> {
    const { edges, burst } = this.deps;
    await edges.refreshLocal();
    const candidates = edges.candidates();
    const burstEdges = candidates.filter((c) => c.pool === burst.pool && c.state === 'ready');
    const moved = { out: [] as string[], back: [] as string[] };
    if (burstEdges.length === 0) return moved;
    const pools = [...new Set(candidates.filter((c) => c.pool !== burst.pool).map((c) => c.pool))];
    for (const pool of pools) {
      const use = poolUtilisation(candidates, pool);
      if (use > burst.threshold) moved.out.push(...(await this.#shed(pool, candidates, now)));
      else if (burst.returnHome && use < burst.threshold - RETURN_MARGIN)
        moved.back.push(...(await this.#bringBack(pool, candidates, burstEdges, now)));
    }
    return moved;
  }

  /** Moves the pool's longest-idle burstable sandboxes to the burst pool, as many as bring it under its threshold. */
  async #shed(pool: string, candidates: PlacementCandidate[], now: number): Promise<string[]> {
    const { inPool, slots, used } = slotsOf(candidates, pool);
    // At least one while above the threshold (memory may be what is over it).
    const excess = Math.max(1, Math.ceil(used - this.deps.burst.threshold * slots));
    const rows = await this.#idleBurstable(
      inPool.map((c) => c.id),
      now,
    );
    return this.#move(rows, Math.min(excess, MOVES_PER_CHECK), { pool: this.deps.burst.pool }, 'burst');
  }

  /** Moves burst-pool sandboxes whose own pool is `pool` back there, while it stays under its threshold. */
  async #bringBack(pool: string, candidates: PlacementCandidate[], burstEdges: PlacementCandidate[], now: number): Promise<string[]> {
    const { slots, used } = slotsOf(candidates, pool);
    const room = Math.floor((this.deps.burst.threshold - RETURN_MARGIN) * slots - used);
    if (room <= 0) return [];
    const rows = await this.#idleBurstable(
      burstEdges.map((c) => c.id),
      now,
      pool,
    );
    return this.#move(rows, Math.min(room, MOVES_PER_CHECK), { pool }, 'return');
  }

  /** Running, idle, burstable sandboxes on `edgeIds` (of home pool `home`, when given), the longest idle first. */
  async #idleBurstable(edgeIds: string[], now: number, home?: string): Promise<SandboxInfo[]> {
    const { store } = this.deps;
    const rows: SandboxInfo[] = [];
    for (const edge of edgeIds) rows.push(...(await store.sandboxes.list({ edge, status: 'running' })));
    const idle = rows
      .filter((s) => !s.migration && now - Date.parse(s.lastActivityAt) >= IDLE_MS)
      .sort((a, b) => Date.parse(a.lastActivityAt) - Date.parse(b.lastActivityAt));
    const out: SandboxInfo[] = [];
    for (const s of idle) {
      const spec = await store.sandboxes.spec<CreateSandboxRequest>(s.id);
      if (!spec?.placement?.burst) continue;
      if (home !== undefined && (spec.placement.pool ?? 'default') !== home) continue;
      out.push(s);
    }
    return out;
  }

  async #move(rows: SandboxInfo[], want: number, req: { pool: string }, cause: MoveCause): Promise<string[]> {
    const moved: string[] = [];
    for (const s of rows) {
      if (moved.length >= want) break;
      try {
        await this.deps.migration.migrate(SYSTEM, s.id, req, cause);
        moved.push(s.id);
      } catch (err) {
        // Busy (a command running), gone, or no room there: the next look tries again.
        const code = err instanceof ApiError ? err.code : 'INTERNAL';
        this.deps.log.info({ sandbox: s.id, cause, code, err: (err as Error).message }, 'a burst move did not happen');
        if (code === 'CAPACITY_EXCEEDED') break;
      }
    }
    return moved;
  }

  /** Looks every `intervalMs` on the replica holding the `burst` lease, until the returned stop function is called. */
  startLoop(intervalMs = BURST_CHECK_MS): () => void {
    const { store, replicaId, log } = this.deps;
    let running = false;
    const timer = setInterval(() => {
      if (running) return;
      running = true;
      void store.leases
        .acquire('burst', replicaId, intervalMs * 3)
        .then(async (mine) => {
          if (mine) await this.check();
        })
        .catch((err: unknown) => log.error({ err }, 'the burst check failed'))
        .finally(() => (running = false));
    }, intervalMs);
    timer.unref();
    return () => {
      clearInterval(timer);
      void store.leases.release('burst', replicaId).catch(() => undefined);
    };
  }
}

/** A pool's ready edges, their sandbox slots and the slots in use, as their last reports say. */
function slotsOf(candidates: PlacementCandidate[], pool: string): { inPool: PlacementCandidate[]; slots: number; used: number } {
  const inPool = candidates.filter((c) => c.pool === pool && c.state === 'ready');
  return {
    inPool,
    slots: inPool.reduce((n, c) => n + c.info.maxSandboxes, 0),
    used: inPool.reduce((n, c) => n + c.info.sandboxes, 0),
  };
}
