import type { SandboxUsage } from '@dsec/sdk/schema';
import { readNumber, sandboxUsage } from '../../../host/cgroups.js';
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
  usage.netRxBytes = hasLink ? (readNumber(`${veth}/tx_bytes`) ?? 0) : 0;
  usage.netTxBytes = hasLink ? (readNumber(`${veth}/rx_bytes`) ?? 0) : 0;
  return usage;
}

/**
 * A measured upper size is given again for a while: an SDK's connect and refresh() inspect, and the
 * dashboard polls it, so a walk per call would be a load of its own. The while grows with what the
 * walk cost: 20 times its time, at least 1 s and at most 10 s (a small upper is walked in
 * milliseconds and stays nearly live; a hundred thousand files are walked at most every 10 s).
 */
const DISK_CACHE_MIN_MS = 1_000;
const DISK_CACHE_MAX_MS = 10_000;
/** A walk that takes longer is abandoned (the figure is left out) rather than hold inspect up. */
const DISK_WALK_TIMEOUT_S = 5;
const measured = new Map<string, { at: number; keepMs: number; bytes: number | undefined; walk?: Promise<number | undefined> }>();

/**
 * Allocated bytes under the upper dir, hard links counted once, this filesystem only. du, not a
 * walk of our own: an agent's upper can hold a hundred thousand files (a node_modules), and du
 * walks them in its own process while the edge goes on.
 */
async function upperBytes(dir: string): Promise<number | undefined> {
  const now = Date.now();
  const last = measured.get(dir);
  if (last?.walk) return last.walk;
  if (last && now - last.at < last.keepMs) return last.bytes;
  // coreutils' timeout ends it: a plain call, so the edge's resident helper starts it (no fork of the edge).
  const walk = runTool('timeout', ['-s', 'KILL', String(DISK_WALK_TIMEOUT_S), 'du', '-s', '-x', '-B1', dir]).then(
    (r) => {
      // du exits 1 when a file vanished under it (a command deleting as it walks): its total stands.
      const total = Number(/^(\d+)\s/.exec(r.stdout)?.[1]);
      return Number.isFinite(total) ? total : undefined;
    },
    () => undefined,
  );
  measured.set(dir, { at: now, keepMs: 0, bytes: last?.bytes, walk });
  const bytes = await walk;
  const done = Date.now();
  measured.set(dir, { at: done, keepMs: Math.min(DISK_CACHE_MAX_MS, Math.max(DISK_CACHE_MIN_MS, 20 * (done - now))), bytes });
  // Forget uppers not asked about for a while (their sandboxes are gone, most likely).
  for (const [d, m] of measured) if (done - m.at > 6 * DISK_CACHE_MAX_MS) measured.delete(d);
  return bytes;
}
