import type { Logger } from 'pino';
import { CGROUP_PARENT, killCgroupProcesses, removeCgroupTreeSettled } from '../../../host/cgroups.js';
import { removeTree } from '../../../host/remove-tree.js';
import type { UidRangePool } from '../../../host/uid-ranges.js';
import { detachLink } from '../../../net/sandbox-network.js';
import type { LayerMounts } from '../../node/layer-mounts.js';
import type { Crun } from './crun.js';
import type { SandboxRecord, SandboxRecords } from './sandbox-record.js';
import { unmountSandboxDir } from './sandbox-unmount.js';

/** Removes everything of a sandbox, in reverse order of creation; safe on half-made ones. */
export async function teardownContainer(
  c: { records: SandboxRecords; crun: Crun; layerMounts: LayerMounts; uidRanges: UidRangePool; log: Logger },
  id: string,
  layers: SandboxRecord['layers'],
  releaseLayers: boolean,
  onReleased?: () => void,
): Promise<void> {
  const paths = c.records.paths(id);
  await c.crun.delete(id);
  const stray = await killCgroupProcesses(`${CGROUP_PARENT}/${id}`);
  if (stray) c.log.warn({ sandbox: id, killed: stray }, 'killed processes crun no longer tracked');
  const stuck = unmountSandboxDir(paths.dir);
  const left = await removeCgroupTreeSettled(`${CGROUP_PARENT}/${id}`);
  if (left.length) c.log.warn({ sandbox: id, cgroups: left }, 'cgroups still busy after the teardown');
  await detachLink(id); // normally gone with the netns; a crash may leave the host end
  // Never a recursive delete through a mount still there (a volume's data is bound in it).
  if (stuck.length) throw new Error(`still mounted after unmounting: ${stuck.join(', ')}`);
  if (releaseLayers) {
    for (const l of layers) c.layerMounts.release(l);
    onReleased?.(); // a retried teardown must not release them twice
  }
  await removeTree(paths.dir);
  c.uidRanges.release(id); // only once nothing of the sandbox is left: its files are the range's
}
