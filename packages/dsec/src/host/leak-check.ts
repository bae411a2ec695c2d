import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { listSandboxCgroups } from './cgroups.js';
import { readMounts } from './mounts.js';
import { runTool } from './run-tool.js';

/**
 * What a dsec data dir has left on the host: sandbox mounts, layer mounts, cgroups, crun
 * containers, sandbox directories, and VM directories and QEMU processes. `onlyIds` narrows it to given sandboxes (other sandboxes of
 * a shared server may be running). An empty list means nothing leaked.
 */
export async function findLeaks(dataDir: string, opts: { onlyIds?: string[]; includeLayers?: boolean } = {}): Promise<string[]> {
  const ids = opts.onlyIds ? new Set(opts.onlyIds) : undefined;
  const mine = (id: string): boolean => !ids || ids.has(id);
  const leaks: string[] = [];
  const nodeDir = join(dataDir, 'node');
  for (const m of readMounts()) {
    if (m.mountPoint.startsWith(join(nodeDir, 'sandboxes') + '/')) {
      const id = m.mountPoint.slice(join(nodeDir, 'sandboxes').length + 1).split('/')[0]!;
      if (mine(id)) leaks.push(`mount ${m.mountPoint}`);
    } else if (opts.includeLayers && m.mountPoint.startsWith(join(nodeDir, 'layers') + '/')) {
      leaks.push(`layer mount ${m.mountPoint}`);
    }
  }
  for (const cg of listSandboxCgroups()) if (mine(cg) && (!ids ? cg.startsWith('sb-') : true)) leaks.push(`cgroup dsec/${cg}`);
  const crunRoot = join(nodeDir, 'crun');
  if (existsSync(crunRoot)) {
    const r = await runTool('crun', ['--root', crunRoot, 'list', '--quiet']);
    for (const id of r.stdout.split('\n').filter(Boolean)) if (mine(id)) leaks.push(`crun container ${id}`);
  }
  const sbDir = join(nodeDir, 'sandboxes');
  if (existsSync(sbDir)) for (const id of readdirSync(sbDir)) if (mine(id)) leaks.push(`directory ${join(sbDir, id)}`);
  // A VM is a directory (disk, sockets) and a QEMU process whose command line names it.
  const vmDir = join(nodeDir, 'vms');
  if (existsSync(vmDir)) for (const id of readdirSync(vmDir)) if (mine(id)) leaks.push(`VM directory ${join(vmDir, id)}`);
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let cmd: string;
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    const m = cmd.startsWith('qemu-system') ? new RegExp(`${escapeRegExp(vmDir)}/([^/\0]+)/agent\\.sock`).exec(cmd) : null;
    if (m && mine(m[1]!)) leaks.push(`QEMU process ${pid} (${m[1]})`);
  }
  return leaks;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
