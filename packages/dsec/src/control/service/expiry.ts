import type { Logger } from 'pino';
import { ApiError } from '../../api-error.js';
import type { CreateLeases } from '../create-leases.js';
import type { EndedSandboxes } from '../ended-sandboxes.js';
import type { Metrics } from '../metrics.js';
import type { OwnedSandboxes } from '../owned-sandboxes.js';
import type { StateStore } from '../state-store.js';
import { SYSTEM } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import type { SandboxService } from './sandboxes.js';

/** How long the expiry sweep's lease lasts without renewal (it renews at every sweep). */
const EXPIRY_LEASE_MS = 5_000;

/** TTLs and idle timeouts, applied by the one replica that holds the expiry lease. */
export class ExpiryService {
  constructor(
    private readonly deps: {
      store: StateStore;
      lookup: SandboxLookup;
      sandboxes: SandboxService;
      ended: EndedSandboxes;
      owned: OwnedSandboxes;
      createLeases: CreateLeases;
      /** Gives up the moves of replicas that died mid-move (MigrationService.recoverAbandoned). */
      abandonedMoves?: () => Promise<unknown>;
      metrics: Metrics;
      replicaId: string;
      log: Logger;
    },
  ) {}

  /**
   * Applies the TTL and idle policies: a running sandbox past its TTL or idle for longer than its
   * timeout is stopped (resources freed, record kept with the reason) or paused. Expiries live in
   * the state store, so one that passed while dsec was down applies at the first sweep after start.
   */
  async sweepExpired(now = Date.now()): Promise<string[]> {
    const { store, log } = this.deps;
    const done: string[] = [];
    await this.deps.ended.expire(now);
    await this.deps.owned.sweep(now);
    for (const e of await store.sandboxes.expired(now)) {
      try {
        const s = await this.deps.lookup.get(SYSTEM, e.id);
        if (e.onExpiry === 'pause' && s.status === 'running') {
          await this.deps.sandboxes.pause(SYSTEM, e.id);
        } else if (e.onExpiry === 'stop') {
          await this.deps.lookup
            .edgeOf(s)
            .killSandbox(e.id)
            .then(
              () => this.deps.metrics.observeKill(s.backend, 'expiry'),
              (err: unknown) => {
                if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
              },
            );
          await store.sandboxes.setStatus(e.id, 'stopped', e.why);
        }
        done.push(e.id);
        log.info({ sandbox: e.id, action: e.onExpiry, why: e.why }, 'sandbox expired');
      } catch (err) {
        log.error({ err, sandbox: e.id }, 'applying expiry failed');
      }
    }
    return done;
  }

  /**
   * Runs sweepExpired (and the takeover of abandoned creates) every `intervalMs` on the replica
   * holding the expiry lease, and renews this replica's create leases, until the returned stop
   * function is called.
   */
  startLoop(intervalMs = 1000): () => void {
    const { store, replicaId, createLeases, log } = this.deps;
    let running = false;
    const timer = setInterval(() => {
      if (running) return;
      running = true;
      // One replica sweeps: the one holding the lease, renewed at each sweep. It also takes over
      // the creates of replicas that died mid-create (create-leases.ts).
      void store.leases
        .acquire('expiry', replicaId, EXPIRY_LEASE_MS)
        .then(async (mine) => {
          if (!mine) return;
          await this.sweepExpired();
          // Few each second, however many are held: the changes to sandbox_counts since the last.
          await store.sandboxes.foldCounts();
          await createLeases.takeOver();
          await this.deps.abandonedMoves?.();
        })
        .catch((err: unknown) => log.error({ err }, 'expiry sweep failed'))
        .finally(() => (running = false));
    }, intervalMs);
    timer.unref();
    const stopRenewing = createLeases.startRenewing(intervalMs);
    return () => {
      clearInterval(timer);
      stopRenewing();
      void store.leases.release('expiry', replicaId).catch(() => undefined);
    };
  }
}
