import { mkdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { CGROUP_PARENT, CGROUP_ROOT, killCgroupProcesses, removeCgroupTree } from '../../../host/cgroups.js';
import { CPU_PERIOD_US } from '../../../host/cgroups.js';

/**
 * Host memory a VM may use beyond its guest RAM: QEMU itself, TCG's translation cache (64 MiB,
 * qemu-launch.ts), device buffers and the page cache of its disks. A guest that fills its RAM
 * stays under guest RAM + this; the host sees one cgroup, not a guest it cannot look into.
 */
export const VM_MEMORY_OVERHEAD_MIB = 256;
/**
 * QEMU's threads: main, one per vCPU, RCU, and block I/O workers (its thread pool tops out at
 * 64). The guest's processes are the guest kernel's and count nothing here.
 */
const VM_PIDS_MAX = 96;

/** Where a VM's cgroups live: the same `dsec/<id>` as a container's, so leak checks and usage read both alike. */
export function vmCgroupRel(id: string): string {
  return join(CGROUP_PARENT, id);
}

/**
 * Makes the VM's cgroups (memory, pids, cpu, cpuacct v1 hierarchies, as crun does for a
 * container) with the sandbox's limits: memory = guest RAM + overhead, CPU time = `cpu` cores
 * (a VM with cpu 0.5 has one vCPU that runs half the time), QEMU's thread count. Returns the
 * cgroup.procs files QEMU is written into before it starts (launchQemu), so every page it
 * touches is charged to the VM.
 */
export function makeVmCgroup(id: string, limits: { cpu: number; memoryMiB: number }): string[] {
  const rel = vmCgroupRel(id);
  const dir = (c: string): string => join(CGROUP_ROOT, c, rel);
  for (const c of ['memory', 'pids', 'cpu', 'cpuacct']) mkdirSync(dir(c), { recursive: true });
  const memory = (limits.memoryMiB + VM_MEMORY_OVERHEAD_MIB) * 1024 * 1024;
  writeFileSync(join(dir('memory'), 'memory.limit_in_bytes'), String(memory));
  const memsw = join(dir('memory'), 'memory.memsw.limit_in_bytes');
  if (existsSync(memsw)) writeFileSync(memsw, String(memory)); // no swapping around the limit
  writeFileSync(join(dir('pids'), 'pids.max'), String(VM_PIDS_MAX));
  writeFileSync(join(dir('cpu'), 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
  writeFileSync(join(dir('cpu'), 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(limits.cpu * CPU_PERIOD_US))));
  writeFileSync(join(dir('cpu'), 'cpu.shares'), String(Math.max(2, Math.round(limits.cpu * 1024))));
  return ['memory', 'pids', 'cpu', 'cpuacct'].map((c) => join(dir(c), 'cgroup.procs'));
}

/** Whether processes run in `dsec/<id>` already (memory hierarchy, which every VM and container joins). */
export function vmCgroupBusy(id: string): boolean {
  try {
    return readFileSync(join(CGROUP_ROOT, 'memory', vmCgroupRel(id), 'cgroup.procs'), 'utf8').trim() !== '';
  } catch {
    return false;
  }
}

/** Kills whatever is left in the VM's cgroups (QEMU normally gone already) and removes them. */
export async function removeVmCgroup(id: string): Promise<void> {
  await killCgroupProcesses(vmCgroupRel(id));
  removeCgroupTree(vmCgroupRel(id));
}
