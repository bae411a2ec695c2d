import type { SandboxBackend } from '@dsec/sdk/schema';
import type { EdgeInfo, SandboxLimits } from '../edge/protocol/edge-api.js';

/** An edge as placement sees it: its last heartbeat plus what was placed on it since. */
export interface PlacementCandidate {
  id: string;
  pool: string;
  labels: Record<string, string>;
  state: 'ready' | 'draining' | 'lost';
  info: EdgeInfo;
  /** Sandboxes placed since the heartbeat `info` came from (not yet in its counts). */
  pending: { count: number; cpu: number; memoryMiB: number; pids: number };
  /**
   * CPU limits (CFS ceilings, not reservations) may add up to this many times the node's CPUs;
   * 0: no cap, CPU only steers the score. Sandboxes are mostly idle (~90 % use ≤ 5 % of what they
   * ask), so a node's real limit is memory and pids, which placement reads as measured.
   */
  cpuOvercommit: number;
}

export interface PlacementRequest {
  limits: SandboxLimits;
  layers: string[];
  /** Only edges of this pool. */
  pool: string;
  /** Only edges carrying every one of these labels. */
  labels?: Record<string, string> | undefined;
  /** Edges that already refused or failed this create. */
  exclude?: ReadonlySet<string>;
  /** microvm/vm: only edges that run VMs, with a VM slot and free memory for the guest's RAM. */
  backend?: SandboxBackend | undefined;
  /** Only this edge: it holds the sandbox's volumes. */
  edge?: string | undefined;
}

/** Best of k random feasible edges (power of k choices, as E2B's and DSec's schedulers do). */
export const PLACEMENT_CHOICES = 2;

/** Memory a node keeps free whatever its limits promise, so the kernel and the edge can breathe. */
const MEMORY_FLOOR_BYTES = 256 << 20;
/** Processes a node keeps free for itself. */
const PIDS_FLOOR = 1024;
/** What a sandbox placed since the last heartbeat is assumed to take until the next one shows it (measured idle: ~1.2 MiB, 2 processes). */
const IDLE_SANDBOX_BYTES = 4 << 20;
const IDLE_SANDBOX_PIDS = 4;

/** Why an edge cannot take the sandbox, or undefined when it can. */
export function infeasible(c: PlacementCandidate, req: PlacementRequest): string | undefined {
  if (c.state !== 'ready') return `edge is ${c.state}`;
  if (c.info.state !== 'running') return `edge reports ${c.info.state}`;
  if (req.edge !== undefined && c.id !== req.edge) return `not edge ${req.edge}, which holds the sandbox's volumes`;
  if (c.pool !== req.pool) return `pool ${c.pool}`;
  for (const [k, v] of Object.entries(req.labels ?? {})) if (c.labels[k] !== v) return `label ${k}`;
  if (req.exclude?.has(c.id)) return 'refused this create already';
  const cap = c.info.capacity;
  if (c.info.sandboxes + c.pending.count >= c.info.maxSandboxes) return 'no sandbox slots';
  if (req.limits.memoryMiB * 1024 * 1024 > cap.memoryBytes) return 'less memory than the limit';
  if (cap.memoryAvailableBytes - c.pending.count * IDLE_SANDBOX_BYTES < MEMORY_FLOOR_BYTES) return 'memory nearly exhausted';
  if (cap.pidMax - cap.pidsInUse - c.pending.count * IDLE_SANDBOX_PIDS < PIDS_FLOOR) return 'pids nearly exhausted';
  if (req.backend && req.backend !== 'container') {
    const why = vmInfeasible(c, req.limits);
    if (why) return why;
  }
  if (c.cpuOvercommit > 0 && cap.cpuCommitted + c.pending.cpu + req.limits.cpu > cap.cpus * c.cpuOvercommit)
    return `cpu overcommit ${c.cpuOvercommit}× reached`;
  return undefined;
}

/**
 * A VM's guest RAM is the host's once the guest touches it (QEMU's memory is charged to the VM's
 * cgroup, vm-cgroup.ts), unlike a container's limit, which is a ceiling mostly unused: a VM needs
 * its RAM plus QEMU's overhead free now, besides the memory limits of whatever was placed since
 * the heartbeat. Sandboxes placed since the heartbeat count against the VM slots too (placement
 * does not know which of them are VMs; the next heartbeat corrects it).
 */
function vmInfeasible(c: PlacementCandidate, limits: SandboxLimits): string | undefined {
  const vms = c.info.capacity.vms;
  if (!vms) return 'runs no microVM/VM sandboxes (no VM guest built)';
  if (vms.running + c.pending.count >= vms.slots) return 'no VM slots';
  const need = (limits.memoryMiB + vms.overheadMiB + c.pending.memoryMiB) * 1048576;
  if (c.info.capacity.memoryAvailableBytes - need < MEMORY_FLOOR_BYTES) return "not enough free memory for the VM's RAM";
  return undefined;
}

/**
 * What a warm layer cache is worth, in sandboxes of load: a node that caches the sandbox's layers
 * scores as if it carried this many fewer (no fetch, a warm page cache). Locality as a load credit
 * rather than a bonus of its own: a bonus as large as the load terms' whole range meant a cold
 * edge could never win against a warm one, so a batch piled onto the edges that happened to warm
 * first and the rest of the cluster never got the image (cluster.test.ts's batch of 30 put 3 of
 * 30 on one edge). With a credit, a warm edge is preferred until it carries a few more creates.
 */
const LOCALITY_CREDIT = 2;
/** Between equally loaded edges (idle ones included, where the credit has nothing to take off), the warm one wins. */
const LOCALITY_TIE = 0.01;

/**
 * A feasible edge's score, about [0, 2]: free CPU (after the overcommit cap, or relative to the
 * node's CPUs without one) and spread (free sandbox slots), each with the load a warm layer cache
 * is worth taken off (LOCALITY_CREDIT, scaled by the share of the sandbox's layers the node caches).
 */
export function score(c: PlacementCandidate, req: PlacementRequest): number {
  const cap = c.info.capacity;
  const cached = new Set(c.info.cachedLayers);
  const locality = req.layers.length ? req.layers.filter((l) => cached.has(l)).length / req.layers.length : 0;
  const credit = LOCALITY_CREDIT * locality;
  const committed = Math.max(0, cap.cpuCommitted + c.pending.cpu - credit * req.limits.cpu);
  const cpuRoom = c.cpuOvercommit > 0 ? Math.max(0, 1 - committed / (cap.cpus * c.cpuOvercommit)) : 1 / (1 + committed / cap.cpus);
  const spread = 1 - Math.max(0, c.info.sandboxes + c.pending.count - credit) / c.info.maxSandboxes;
  return cpuRoom + spread + LOCALITY_TIE * locality;
}

/**
 * Picks an edge from the capacity the heartbeats brought (no round trip per create): filter the
 * feasible ones, then the best of PLACEMENT_CHOICES random picks. Random sampling keeps two
 * control-plane replicas (or a burst of creates between heartbeats) from piling onto the one edge
 * that scored best a moment ago. Returns undefined when no edge can take it.
 */
export function place(
  candidates: PlacementCandidate[],
  req: PlacementRequest,
  random: () => number = Math.random,
): PlacementCandidate | undefined {
  const feasible = candidates.filter((c) => infeasible(c, req) === undefined);
  if (feasible.length === 0) return undefined;
  let best: PlacementCandidate | undefined;
  let bestScore = -Infinity;
  for (let i = 0; i < Math.min(PLACEMENT_CHOICES, feasible.length); i++) {
    const j = i + Math.floor(random() * (feasible.length - i));
    [feasible[i], feasible[j]] = [feasible[j]!, feasible[i]!];
    const s = score(feasible[i]!, req);
    if (s > bestScore) {
      best = feasible[i];
      bestScore = s;
    }
  }
  return best;
}

/** Share of a pool's capacity in use (the larger of sandbox slots and memory), for bursting. */
export function poolUtilisation(candidates: PlacementCandidate[], pool: string): number {
  let slots = 0;
  let used = 0;
  let mem = 0;
  let memUsed = 0;
  for (const c of candidates) {
    if (c.pool !== pool || c.state !== 'ready') continue;
    slots += c.info.maxSandboxes;
    used += c.info.sandboxes + c.pending.count;
    mem += c.info.capacity.memoryBytes;
    memUsed += c.info.capacity.memoryBytes - c.info.capacity.memoryAvailableBytes;
  }
  if (slots === 0) return 1;
  return Math.max(used / slots, mem ? memUsed / mem : 0);
}
