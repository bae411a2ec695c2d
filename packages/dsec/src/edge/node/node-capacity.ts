import { readFileSync } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import type { EdgeCapacity, SandboxLimits } from '../protocol/schemas.js';

/** MemAvailable in bytes (the kernel's estimate of memory a new workload can use without swapping). */
function memAvailableBytes(): number {
  try {
    const m = /^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'));
    return m ? Number(m[1]) * 1024 : totalmem();
  } catch {
    return totalmem();
  }
}

function pidMax(): number {
  try {
    return Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8').trim());
  } catch {
    return 32768;
  }
}

/** Processes and threads on the node: the denominator of /proc/loadavg's fourth field. */
function pidsInUse(): number {
  try {
    return Number(/ \d+\/(\d+) /.exec(readFileSync('/proc/loadavg', 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** The last /proc/stat sample: busy share is measured between two heartbeats. */
let lastCpu: { busy: number; total: number; usage: number | undefined } | undefined;

/**
 * Share of CPU time busy (everything but idle and iowait) since the previous call, from
 * /proc/stat's aggregate line; undefined at the first call or where /proc/stat is unreadable.
 * Calls closer together than a few ticks keep the last answer (the difference would be noise).
 */
function cpuUsage(): number | undefined {
  let fields: number[];
  try {
    fields = (/^cpu\s+(.*)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1] ?? '').trim().split(/\s+/).map(Number);
  } catch {
    return undefined;
  }
  if (fields.length < 5 || fields.some((n) => !Number.isFinite(n))) return undefined;
  // user nice system idle iowait irq softirq steal; guest time is already in user, so not added.
  const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
  const busy = total - fields[3]! - fields[4]!;
  const prev = lastCpu;
  if (prev && total - prev.total < 10) return prev.usage;
  const usage = prev ? Math.round(Math.min(1, Math.max(0, (busy - prev.busy) / (total - prev.total))) * 1000) / 1000 : undefined;
  lastCpu = { busy, total, usage };
  return usage;
}

/**
 * What this node has, measured here, and what its sandboxes were promised: the facts placement
 * decides from. They come from the node's edge, never from the control plane's own host.
 */
export function nodeCapacity(limits: SandboxLimits[]): EdgeCapacity {
  let cpu = 0;
  let mem = 0;
  let pids = 0;
  for (const l of limits) {
    cpu += l.cpu;
    mem += l.memoryMiB;
    pids += l.pids;
  }
  return {
    cpus: availableParallelism(),
    memoryBytes: totalmem(),
    memoryAvailableBytes: memAvailableBytes(),
    cpuCommitted: Math.round(cpu * 1000) / 1000,
    memoryCommittedMiB: mem,
    pidsCommitted: pids,
    pidMax: pidMax(),
    pidsInUse: pidsInUse(),
    ...withCpuUsage(cpuUsage()),
  };
}

function withCpuUsage(usage: number | undefined): { cpuUsage?: number } {
  return usage === undefined ? {} : { cpuUsage: usage };
}
