import type { Logger } from 'pino';
import { ApiError } from '../api-error.js';
import type { EdgeRegistry } from './edges/edge-registry.js';
import type { CreateLease, StateStore } from './state-store.js';

/**
 * How long a create stays its replica's without renewal. Renewed every second while the replica
 * lives, so only a replica that died (or lost the store) for this long gives its creates up.
 */
export const CREATE_LEASE_MS = 10_000;

/**
 * Creates in flight are vouched for by the replica making them: each sandbox row written as
 * `creating` names its replica and a lease the replica renews every second (one UPDATE for all of
 * its creates). A replica that dies mid-create leaves rows whose lease runs out; the replica that
 * holds the expiry lease takes them over: a sandbox its edge runs becomes `running`, one it does
 * not is killed there (a kill waits for a create still in flight on the edge) and becomes `failed`
 * with the reason. Without this such a row would stay `creating` for ever, since reconcile leaves
 * creates to their create and only runs when an edge comes back.
 */
export class CreateLeases {
  constructor(
    private readonly store: Pick<StateStore, 'sandboxes' | 'moves'>,
    private readonly edges: EdgeRegistry,
    private readonly log: Logger,
    readonly replicaId: string,
  ) {}

  /** The lease a create written now starts with. */
  lease(now = Date.now()): CreateLease {
    return { owner: this.replicaId, until: now + CREATE_LEASE_MS };
  }

  /** Renews this replica's creates every `intervalMs` until the returned stop function is called. */
  startRenewing(intervalMs = 1000): () => void {
    let busy = false;
    const timer = setInterval(() => {
      if (busy) return;
      busy = true;
      // A move (service/migration.ts) is vouched for the same way, with the same lease.
      const until = Date.now() + CREATE_LEASE_MS;
      void Promise.all([this.store.sandboxes.renewCreates(this.replicaId, until), this.store.moves.renew(this.replicaId, until)])
        .catch((err: unknown) => this.log.error({ err }, 'renewing create leases failed'))
        .finally(() => (busy = false));
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }

  /**
   * Settles every create whose replica stopped renewing it (call on one replica: the expiry
   * lease's holder). An edge that cannot be asked now is asked at the next sweep; one that is
   * lost has its rows marked lost by the edge watcher instead.
   */
  async takeOver(now = Date.now()): Promise<{ running: string[]; failed: string[] }> {
    const out = { running: [] as string[], failed: [] as string[] };
    const abandoned = await this.store.sandboxes.abandonedCreates(now);
    const lists = new Map<string, Promise<Set<string> | undefined>>();
    for (const row of abandoned) {
      let list = lists.get(row.edge);
      if (!list) {
        list = this.#listOf(row.edge);
        lists.set(row.edge, list);
      }
      const onEdge = await list;
      if (onEdge === undefined) continue;
      const who = `its control-plane replica ${row.owner} stopped (no lease renewal for ${CREATE_LEASE_MS / 1000} s) while creating it`;
      if (onEdge.has(row.id)) {
        if ((await this.store.sandboxes.settleCreate(row.id, 'running')) === 'running') out.running.push(row.id);
        this.log.warn({ sandbox: row.id, edge: row.edge, owner: row.owner }, 'took over an abandoned create: its edge runs it');
        continue;
      }
      if (this.edges.has(row.edge)) {
        try {
          // Not listed, but maybe still being made: the edge's kill waits for that create, then removes it.
          await this.edges.apiEvenIfLost(row.edge).killSandbox(row.id);
        } catch (err) {
          if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) {
            this.log.warn(
              { sandbox: row.id, edge: row.edge, err: (err as Error).message },
              'an abandoned create could not be removed from its edge yet; retried at the next sweep',
            );
            continue;
          }
        }
      }
      const reason = `failed: ${who}, and its edge ${row.edge} did not have it`;
      if ((await this.store.sandboxes.settleCreate(row.id, 'failed', reason)) === 'failed') out.failed.push(row.id);
      this.log.warn({ sandbox: row.id, edge: row.edge, owner: row.owner }, 'took over an abandoned create: not on its edge, failed');
    }
    return out;
  }

  /** The sandboxes an edge holds; undefined when it cannot be asked now. An edge that left has none. */
  async #listOf(edge: string): Promise<Set<string> | undefined> {
    if (!this.edges.has(edge)) return new Set();
    try {
      return new Set((await this.edges.apiEvenIfLost(edge).listSandboxes()).map((s) => s.id));
    } catch (err) {
      this.log.warn(
        { edge, err: (err as Error).message },
        'abandoned creates on an edge that does not answer: asked again at the next sweep',
      );
      return undefined;
    }
  }
}
