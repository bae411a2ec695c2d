import { readFileSync } from 'node:fs';
import type { SandboxUsage } from '@dsec/sdk/schema';
import { sandboxUsage } from '../../../host/cgroups.js';
import { memoryPeaks } from '../../../host/memory-peaks.js';
import { runTool } from '../../../host/run-tool.js';
import { hostVeth } from '../../../net/sandbox-network.js';

/**
 * What a container sandbox has used, for inspect: its cgroup's figures (memory now and at its
 * peak, CPU time, processes, OOM kills), the disk its writable layer takes and the bytes on its
 * network link.
 */
export async function containerUsage(id: string, upperDir: string, hasLink: boolean): Promise<SandboxUsage> {
  const usage: SandboxUsage = sandboxUsage(id);
  const peak = memoryPeaks.lifetime(id);
  if (peak !== undefined) usage.peakMemoryBytes = Math.max(peak, usage.memoryBytes);
  const disk = await upperBytes(upperDir);
  if (disk !== undefined) usage.diskBytes = disk;
  // The host end's counters: what the host end received the sandbox sent.
  const veth = `/sys/class/net/${hostVeth(id)}/statistics`;
  usage.netRxBytes = hasLink ? (counter(`${veth}/tx_bytes`) ?? 0) : 0;
  usage.netTxBytes = hasLink ? (counter(`${veth}/rx_bytes`) ?? 0) : 0;
  return usage;
}

/** How long a measured upper size is given again: an SDK's connect and refresh() inspect, and a walk per call would be a load of its own. */
const DISK_CACHE_MS = 10_000;
/** A walk that takes longer is abandoned (the figure is left out) rather than hold inspect up. */
const DISK_WALK_TIMEOUT_MS = 5_000;
const measured = new Map<string, { at: number; bytes: number | undefined; walk?: Promise<number | undefined> }>();

/**
 * Allocated bytes under the upper dir, hard links counted once, this filesystem only, measured at
 * most every 10 s per upper. du, not a walk of our own: an agent's upper can hold a hundred
 * thousand files (a node_modules), and du walks them in its own process while the edge goes on.
 */
async function upperBytes(dir: string): Promise<number | undefined> {
  const now = Date.now();
  const last = measured.get(dir);
  if (last?.walk) return last.walk;
  if (last && now - last.at < DISK_CACHE_MS) return last.bytes;
  // coreutils' timeout ends it: a plain call, so the edge's resident helper starts it (no fork of the edge).
  const walk = runTool('timeout', ['-s', 'KILL', String(DISK_WALK_TIMEOUT_MS / 1000), 'du', '-s', '-x', '-B1', dir]).then(
    (r) => {
      // du exits 1 when a file vanished under it (a command deleting as it walks): its total stands.
      const total = Number(/^(\d+)\s/.exec(r.stdout)?.[1]);
      return Number.isFinite(total) ? total : undefined;
    },
    () => undefined,
  );
  measured.set(dir, { at: now, bytes: last?.bytes, walk });
  const bytes = await walk;
  measured.set(dir, { at: Date.now(), bytes });
  // Forget uppers not asked about for a while (their sandboxes are gone, most likely).
  for (const [d, m] of measured) if (now - m.at > 6 * DISK_CACHE_MS) measured.delete(d);
  return bytes;
}

function counter(file: string): number | undefined {
  try {
    return Number(readFileSync(file, 'utf8').trim());
  } catch {
    return undefined;
  }
}
