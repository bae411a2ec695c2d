import { round } from './stats.js';

/** One of the issues' targets, checked against a run. `ok` is undefined when it could not be judged. */
export interface TargetCheck {
  target: string;
  measured: string;
  ok: boolean | undefined;
  /** By how much it is missed or met, or why it could not be judged. */
  note: string;
}

/** `value` must be ≤ `limit` (or ≥ when `atLeast`): the check, with the margin in words. */
export function check(
  target: string,
  value: number,
  limit: number,
  unit: string,
  opts: { atLeast?: boolean; measured?: string; missing?: string } = {},
): TargetCheck {
  if (!Number.isFinite(value) || !Number.isFinite(limit)) {
    return { target, measured: opts.measured ?? 'n/a', ok: undefined, note: opts.missing ?? 'not measured' };
  }
  const measured = opts.measured ?? `${round(value, 2)} ${unit}`;
  const ok = opts.atLeast ? value >= limit : value <= limit;
  const diff = Math.abs(value - limit);
  const pct = round((100 * diff) / limit, 0);
  const note = ok
    ? `met, ${round(diff, 2)} ${unit} (${pct}%) of headroom`
    : `missed by ${round(diff, 2)} ${unit} (${pct}% ${opts.atLeast ? 'short of' : 'over'} the target)`;
  return { target, measured, ok, note };
}

/** A ratio target ("dsec p50 ≤ 1.2× crun p50"), judged in ms against the budget the ratio allows. */
export function ratioCheck(target: string, dsecMs: number, floorMs: number, maxRatio: number, floorName: string): TargetCheck {
  const budget = floorMs * maxRatio;
  const ratio = dsecMs / floorMs;
  const measured = `${round(dsecMs, 2)} ms vs ${floorName} ${round(floorMs, 2)} ms = ${round(ratio, 2)}×`;
  const c = check(target, dsecMs, budget, 'ms', { measured, missing: `${floorName} did not run` });
  if (c.ok === undefined) return c;
  return { ...c, note: `${c.note}; budget ${round(budget, 2)} ms (${maxRatio}× ${round(floorMs, 2)} ms)` };
}

export const TARGETS = {
  /** Issue 12 (was 1.2 in issue 1): dsec's create p50 within this of raw `crun run -d`'s, same run. */
  createRatio: 1.15,
  createsPerSecond: 30,
  memoryMiB: 1.2,
  /** Issue 12 (was 1.5 in issue 1): dsec's exec p50 within this of raw `crun exec`'s, same run. */
  execRatio: 1.2,
  /** Issue 32: an exec path without crun, at half of raw `crun exec`'s p50 … */
  execVsCrunNext: 0.5,
  /** … and within this of the kernel's floor (setns + fork + exec: native/exec-floor.c). */
  execVsFloor: 2,
  /** Issue 32: `dsec bench rollout`'s steps/s at 32 sandboxes through the TS SDK, at least this × docker exec's. */
  rolloutVsDocker: 3,
  /** Issue 12: the next sandbox's create and exec p50 on a full node within this of an empty node's. */
  fullNodeRatio: 1.5,
  /** Issue 6: this many sandboxes created, each running one command, within burstSeconds. */
  burstCount: 1000,
  burstSeconds: 30,
  /** Issue 6: pause and resume p50 (ms). */
  pauseMs: 5,
  /** Issue 4: a snapshot of snapshotMiB written takes at most snapshotMs. */
  snapshotMiB: 100,
  snapshotMs: 2000,
  /** Issue 4: restore p50 ≤ create p50 + this (ms). */
  restoreOverCreateMs: 20,
  /** Issue 5: a network policy switch in force within this (ms). */
  policySwitchMs: 10,
  /** Issue 5: the defences add at most this much to create p50 (%). */
  hardeningCreatePct: 10,
  /** A network policy adds at most this to create p50 (issue 12: dsec+net vs dsec, same run). */
  networkCreateMs: 10,
  /** Issue 11: the control plane's own create rate against simulated edges, through the public API (DSec's cluster figure). */
  clusterCreatesPerSecond: 5000,
  /** Issue 31 (issue 11 asked for 10 s): a batch of this many from accepted to all placed within clusterBatchSeconds. */
  clusterBatchCount: 32000,
  clusterBatchSeconds: 2,
  /** Issue 11: sandboxes per edge across equal edges differ by at most this much (max/min − 1, %). */
  clusterSpreadPct: 10,
  /** Issue 31: sandboxes one control plane holds (on ≥ clusterHoldEdges simulated edges) while these latencies hold. */
  clusterHoldSandboxes: 400_000,
  clusterHoldEdges: 100,
  /** Issue 31: GET /v1/sandboxes/{id} and a list by label (each page), p99 (ms). */
  clusterHoldReadP99Ms: 50,
  /** Issue 31: one /metrics scrape, and the dashboard's overview (all it fetches at once), p99 (ms). */
  clusterHoldMetricsMs: 200,
  clusterHoldOverviewMs: 200,
  /** Issue 33: an idle container with this many MiB written moves between edges within migrateContainerMs (p50). */
  migrateContainerMib: 10,
  migrateContainerMs: 1000,
  /** Issue 33: a microVM with this much guest memory moves within migrateVmMs under TCG (p50). */
  migrateVmMemoryMib: 256,
  migrateVmMs: 5000,
} as const;
