import { which } from 'dsec/host';

/** Why a test that runs real sandboxes cannot run here (printed as its skip reason), or undefined. The same checks as dsec's own integration tests. */
export function integrationSkipReason(): string | undefined {
  if (process.platform !== 'linux') return 'integration tests need Linux';
  if (process.getuid?.() !== 0) return 'integration tests need root (mounts, namespaces, cgroups); run the suite as root';
  for (const tool of ['crun', 'mkfs.erofs', 'catatonit', 'busybox']) {
    if (!which(tool)) return `integration tests need ${tool} on PATH`;
  }
  return undefined;
}
