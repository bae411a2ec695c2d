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

/**
 * Allocated bytes under the upper dir, hard links counted once, this filesystem only. du, not a
 * walk of our own: an agent's upper can hold a hundred thousand files (a node_modules), and du
 * walks them in its own process (the edge's resident helper starts it) while the edge goes on.
 */
async function upperBytes(dir: string): Promise<number | undefined> {
  const r = await runTool('du', ['-s', '-x', '-B1', dir]);
  // du exits 1 when a file vanished under it (a command deleting as it walks): its total stands.
  const total = Number(/^(\d+)\s/.exec(r.stdout)?.[1]);
  return Number.isFinite(total) ? total : undefined;
}

function counter(file: string): number | undefined {
  try {
    return Number(readFileSync(file, 'utf8').trim());
  } catch {
    return undefined;
  }
}
