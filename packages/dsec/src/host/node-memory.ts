import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CGROUP_PARENT, CGROUP_ROOT } from './cgroups.js';

/** What the node can still give a sandbox, and what says so. */
export interface NodeMemory {
  /** The least of MemAvailable and every bounding memory cgroup's headroom, in bytes. */
  availableBytes: number;
  /** Where that figure comes from: `MemAvailable`, or the memory cgroup whose limit is nearest. */
  source: string;
  /** PSI `full avg10` of the node's memory (% of the last 10 s in which every task waited on memory); undefined without PSI. */
  fullAvg10: number | undefined;
}

/** A memory cgroup's limit above this is no limit (v1 writes "unlimited" as a page-rounded 2^63). */
const NO_LIMIT = 2 ** 60;

function readText(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}

/** `MemAvailable` of /proc/meminfo in bytes (the kernel's estimate of what can be had without swapping). */
export function memAvailableBytes(meminfo = readText('/proc/meminfo') ?? ''): number | undefined {
  const kib = /^MemAvailable:\s+(\d+) kB$/m.exec(meminfo)?.[1];
  return kib === undefined ? undefined : Number(kib) * 1024;
}

/** `full avg10` of a PSI file (/proc/pressure/memory), as a percentage. */
export function psiFullAvg10(text: string | undefined): number | undefined {
  const v = text && /^full avg10=([\d.]+)/m.exec(text)?.[1];
  return v ? Number(v) : undefined;
}

/**
 * A memory cgroup's headroom: its limit less what it uses that cannot be reclaimed at once (usage
 * less inactive page cache, as the kubelet counts a working set). v1 (memory.limit_in_bytes) or v2
 * (memory.max); undefined when it has no limit or no such files.
 */
export function cgroupHeadroomBytes(dir: string): number | undefined {
  const v1 = readText(join(dir, 'memory.limit_in_bytes'));
  const limitText = v1 ?? readText(join(dir, 'memory.max'));
  if (limitText === undefined || limitText.trim() === 'max') return undefined;
  const limit = Number(limitText.trim());
  if (!Number.isFinite(limit) || limit >= NO_LIMIT) return undefined;
  const usage = Number((readText(join(dir, v1 !== undefined ? 'memory.usage_in_bytes' : 'memory.current')) ?? '0').trim());
  const stat = readText(join(dir, 'memory.stat')) ?? '';
  const inactiveFile = Number(/^(?:total_inactive_file|inactive_file) (\d+)$/m.exec(stat)?.[1] ?? 0);
  return Math.max(0, limit - Math.max(0, usage - inactiveFile));
}

/**
 * The node's memory as admission sees it. Besides the host's MemAvailable, the memory cgroups that
 * bound every sandbox count: the root one this process sees (an edge in a container sees its
 * container's cgroup there) and the sandboxes' parent (`dsec`, where an operator may cap them all).
 */
export function nodeMemory(root = CGROUP_ROOT): NodeMemory {
  let availableBytes = memAvailableBytes() ?? Number.MAX_SAFE_INTEGER;
  let source = 'MemAvailable';
  for (const dir of [join(root, 'memory'), join(root, 'memory', CGROUP_PARENT), join(root, CGROUP_PARENT)]) {
    const headroom = cgroupHeadroomBytes(dir);
    if (headroom !== undefined && headroom < availableBytes) {
      availableBytes = headroom;
      source = `the memory cgroup ${dir}`;
    }
  }
  return { availableBytes, source, fullAvg10: psiFullAvg10(readText('/proc/pressure/memory')) };
}

/**
 * Asks the kernel to spare this process (and the helpers it starts) when the node runs out of
 * memory: an edge that dies takes the management of every sandbox with it, while a sandbox's
 * command is the one to kill (sandboxes run at SANDBOX_OOM_SCORE_ADJ). Lowering the score needs
 * CAP_SYS_RESOURCE; without it the process keeps its score and says why.
 */
export function protectFromOomKiller(score = DSEC_OOM_SCORE_ADJ): { ok: true } | { ok: false; why: string } {
  try {
    writeFileSync('/proc/self/oom_score_adj', String(score));
    return { ok: true };
  } catch (err) {
    return { ok: false, why: (err as Error).message };
  }
}

/** dsec's own processes: killed last (-1000 would make them unkillable, and a leaking edge must still be stoppable). */
export const DSEC_OOM_SCORE_ADJ = -900;
/** A sandbox's processes (init and every command): killed before dsec's and the host's own when the node runs out of memory. */
export const SANDBOX_OOM_SCORE_ADJ = 500;
