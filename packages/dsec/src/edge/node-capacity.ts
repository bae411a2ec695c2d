import { readFileSync } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import type { EdgeCapacity, SandboxLimits } from './protocol/schemas.js';

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
  };
}
