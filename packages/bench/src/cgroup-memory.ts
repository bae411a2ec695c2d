import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CGROUP_ROOT } from 'dsec/host';

/** Where a peer's sandboxes' cgroups are: a parent, and a name prefix when the parent is shared. */
export interface CgroupScope {
  parent: string;
  prefix?: string;
}

function usage(dir: string): number {
  // cgroup v1 (this host) names it usage_in_bytes; v2 memory.current.
  for (const f of ['memory.usage_in_bytes', 'memory.current']) {
    try {
      return Number(readFileSync(join(dir, f), 'utf8'));
    } catch {
      // try the other name
    }
  }
  return NaN;
}

/**
 * Memory charged to a peer's cgroups (hierarchical: children included): what the kernel bills
 * the sandboxes themselves, unlike MemAvailable it is blind to other tenants of the host, and
 * blind to what lives outside the sandboxes' cgroups (runtime daemons, shims, kernel objects).
 */
export function cgroupCharged(scope: CgroupScope): number {
  const v1 = join(CGROUP_ROOT, 'memory');
  const base = existsSync(join(v1, 'memory.usage_in_bytes')) ? v1 : CGROUP_ROOT;
  const dir = join(base, scope.parent);
  if (!scope.prefix) return usage(dir);
  let total = 0;
  try {
    for (const d of readdirSync(dir, { withFileTypes: true }))
      if (d.isDirectory() && d.name.startsWith(scope.prefix)) total += usage(join(dir, d.name));
  } catch {
    return NaN;
  }
  return total;
}
