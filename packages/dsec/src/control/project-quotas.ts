import type { ProjectQuota, ProjectUsage } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import type { SandboxLimits } from '../edge/protocol/edge-api.js';
import type { StateStore } from './state-store.js';
import { thenOrNow, type MaybePromise } from '../maybe-promise.js';

/** How a create is admitted (ProjectQuotas.admit). */
export interface AdmitOptions {
  pace?: boolean;
  fit?: boolean;
  rate?: boolean;
  onShort?: (err: ApiError) => void;
}

/**
 * Per-project quotas, enforced where sandboxes are admitted (SandboxCreation, so every path that
 * creates counts: create, batches, forks, replays, E2B's create). Counts, CPU and memory are read
 * from the store's live rows under a per-project lock held from the check to the row's insert,
 * so two creates cannot both take the last slot. The create rate is a token bucket per project
 * in this process (one second of creates deep); with several control-plane replicas each
 * enforces the rate on its own share of the traffic.
 */
export class ProjectQuotas {
  readonly #buckets = new Map<string, { tokens: number; at: number }>();
  readonly #locks = new Map<string, Promise<unknown>>();

  constructor(private readonly store: Pick<StateStore, 'projects'>) {}

  /** At once when the project is kept in memory (store/read-cache.ts). */
  quotaOf(project: string): MaybePromise<ProjectQuota> {
    return thenOrNow(this.store.projects.get(project), (found) => found?.quota ?? {});
  }

  /**
   * Admits `n` sandboxes of `limits` for `project` and runs `insert` (the rows' write) while no
   * other admission of the project can run. Throws the quota's code when they do not fit, and
   * QUOTA_CREATE_RATE_EXCEEDED when the create rate is spent (unless `pace`: then it waits for
   * the tokens, as a batch does). `fit`: admit as many of the n as fit (at least one) instead of
   * refusing them all; the number admitted is passed to insert, with whether the project's lock
   * is held meanwhile (then the insert must not wait for other creates: they wait for it).
   * A project without quotas, kept in memory, costs no promise of its own: `insert`'s answer is
   * returned as it is (most creates).
   */
  admit<T>(
    project: string,
    limits: SandboxLimits,
    n: number,
    insert: (admitted: number, locked: boolean) => T | Promise<T>,
    opts: AdmitOptions = {},
  ): Promise<T> | T {
    try {
      return thenOrNow(this.quotaOf(project), (quota) => this.#rated(quota, project, limits, n, insert, opts));
    } catch (err) {
      return Promise.reject(err as Error);
    }
  }

  /**
   * The create rate's tokens taken (or waited for, with `pace`), then `insert`: at once when the
   * project has no count, CPU or memory quota, else under its lock with the room checked.
   */
  #rated<T>(
    quota: ProjectQuota,
    project: string,
    limits: SandboxLimits,
    n: number,
    insert: (admitted: number, locked: boolean) => T | Promise<T>,
    opts: AdmitOptions,
  ): Promise<T> | T {
    const within = (): Promise<T> | T => {
      if (quota.maxSandboxes === undefined && quota.maxCpu === undefined && quota.maxMemoryMiB === undefined) return insert(n, false);
      return this.#locked(project, async () => {
        const usage = await this.store.projects.usage(project);
        let admitted = n;
        if (opts.fit) admitted = Math.min(n, room(quota, usage, limits));
        if (admitted < 1 || !opts.fit) checkFits(project, quota, usage, limits, opts.fit ? 1 : n);
        if (admitted < n) {
          try {
            checkFits(project, quota, usage, limits, admitted + 1);
          } catch (err) {
            opts.onShort?.(err as ApiError);
          }
        }
        return insert(admitted, true);
      });
    };
    if (quota.createsPerSecond !== undefined && opts.rate !== false) {
      if (opts.pace) return this.#pace(project, quota.createsPerSecond, n).then(within);
      this.#take(project, quota.createsPerSecond, n);
    }
    return within();
  }

  /**
   * Refuses a request for `n` sandboxes that could never fit the project's quota (more than it
   * allows at all), or that does not fit now (`now`), before any work is done for it (a batch's
   * 32,000 failures, a fork's snapshot). The rate is not checked here: batches and forks pace.
   */
  async precheck(project: string, limits: SandboxLimits, n: number, now: boolean): Promise<void> {
    const quota = await this.quotaOf(project);
    const usage = await this.store.projects.usage(project);
    // Not `now`: only what could never fit is refused (the request alone is over the quota); the
    // message still says what is in use, not 0.
    checkFits(project, quota, now ? usage : { sandboxes: 0, cpu: 0, memoryMiB: 0 }, limits, n, usage);
  }

  /** Forgets a project's rate bucket (its quota changed). */
  reset(project: string): void {
    this.#buckets.delete(project);
  }

  #refill(project: string, rate: number): { tokens: number; at: number } {
    const depth = Math.max(1, rate);
    const now = performance.now();
    let b = this.#buckets.get(project);
    if (!b) this.#buckets.set(project, (b = { tokens: depth, at: now }));
    b.tokens = Math.min(depth, b.tokens + ((now - b.at) / 1000) * rate);
    b.at = now;
    return b;
  }

  #take(project: string, rate: number, n: number): void {
    const b = this.#refill(project, rate);
    if (b.tokens < n) throw rateError(project, rate, n, b.tokens);
    b.tokens -= n;
  }

  /** Takes n tokens, waiting for them (at most one second's worth at a time). */
  async #pace(project: string, rate: number, n: number): Promise<void> {
    let left = n;
    while (left > 0) {
      const b = this.#refill(project, rate);
      const want = Math.min(left, Math.max(1, Math.floor(Math.max(1, rate))));
      if (b.tokens >= want) {
        b.tokens -= want;
        left -= want;
        continue;
      }
      await new Promise((resolve) => setTimeout(resolve, Math.ceil(((want - b.tokens) / rate) * 1000)));
    }
  }

  async #locked<T>(project: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(project) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.catch(() => undefined);
    this.#locks.set(project, tail);
    try {
      return await run;
    } finally {
      if (this.#locks.get(project) === tail) this.#locks.delete(project);
    }
  }
}

/** How many more sandboxes of `limits` fit the quota now. */
function room(quota: ProjectQuota, usage: ProjectUsage, limits: SandboxLimits): number {
  let r = Number.POSITIVE_INFINITY;
  if (quota.maxSandboxes !== undefined) r = Math.min(r, quota.maxSandboxes - usage.sandboxes);
  if (quota.maxCpu !== undefined && limits.cpu > 0) r = Math.min(r, Math.floor((quota.maxCpu - usage.cpu + 1e-9) / limits.cpu));
  if (quota.maxMemoryMiB !== undefined && limits.memoryMiB > 0)
    r = Math.min(r, Math.floor((quota.maxMemoryMiB - usage.memoryMiB) / limits.memoryMiB));
  return Math.max(0, r);
}

/** `usage` is what counts against the quota; `inUse` what the message reports (the live sandboxes now). */
function checkFits(project: string, quota: ProjectQuota, usage: ProjectUsage, limits: SandboxLimits, n: number, inUse = usage): void {
  const alone = usage !== inUse;
  const over = (
    code: 'QUOTA_SANDBOXES_EXCEEDED' | 'QUOTA_CPU_EXCEEDED' | 'QUOTA_MEMORY_EXCEEDED',
    name: keyof ProjectQuota,
    limit: number,
    used: number,
    requested: number,
    unit: string,
  ): ApiError =>
    new ApiError(
      code,
      alone
        ? `project ${project}'s quota ${name} is ${limit}${unit}: ${requested}${unit} asked for at once is more than it allows at all (${used}${unit} in use now); ask for fewer, or ask an admin for more (dsec project set-quota)`
        : `project ${project}'s quota ${name} is ${limit}${unit}: ${used}${unit} in use by its live sandboxes, ${requested}${unit} more asked for; kill sandboxes or ask an admin for more (dsec project set-quota)`,
      { project, quota: name, limit, used, requested },
    );
  if (quota.maxSandboxes !== undefined && usage.sandboxes + n > quota.maxSandboxes)
    throw over('QUOTA_SANDBOXES_EXCEEDED', 'maxSandboxes', quota.maxSandboxes, inUse.sandboxes, n, '');
  if (quota.maxCpu !== undefined && usage.cpu + limits.cpu * n > quota.maxCpu + 1e-9)
    throw over('QUOTA_CPU_EXCEEDED', 'maxCpu', quota.maxCpu, inUse.cpu, limits.cpu * n, ' CPU');
  if (quota.maxMemoryMiB !== undefined && usage.memoryMiB + limits.memoryMiB * n > quota.maxMemoryMiB) {
    throw over('QUOTA_MEMORY_EXCEEDED', 'maxMemoryMiB', quota.maxMemoryMiB, inUse.memoryMiB, limits.memoryMiB * n, ' MiB');
  }
}

function rateError(project: string, rate: number, n: number, tokens: number): ApiError {
  const retryAfterMs = Math.ceil(((Math.min(n, Math.max(1, rate)) - tokens) / rate) * 1000);
  return new ApiError(
    'QUOTA_CREATE_RATE_EXCEEDED',
    `project ${project} creates more than its quota of ${rate} sandboxes per second; retry in ${retryAfterMs} ms`,
    {
      project,
      quota: 'createsPerSecond',
      limit: rate,
      requested: n,
      retryAfterMs,
    },
  );
}
