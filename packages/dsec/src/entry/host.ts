/**
 * Entry point `dsec/host`, for the benchmark suite (`packages/bench`) and its peers: the host
 * facts and tools dsec itself relies on (running a tool with its stderr kept, cgroups, mounts,
 * `which`, the data dir's filesystem, the leak check, host uid ranges, the spawn helper), so a
 * peer measures and cleans up with the same code dsec does.
 */
export { runTool, runToolOrThrow, type ToolResult } from '../host/run-tool.js';
export { CGROUP_PARENT, CGROUP_ROOT, cgroupPids, cloneCpusetIntoSandboxes, removeCgroupTree, v1Hierarchies } from '../host/cgroups.js';
export { mountsUnder } from '../host/mounts.js';
export { fixDataDirFs } from '../host/data-dir-fs.js';
export { dataDirImagePath } from '../host/data-dir-image.js';
export { which } from '../host/doctor.js';
export { findLeaks } from '../host/leak-check.js';
export { UidRangePool } from '../host/uid-ranges.js';
export { SpawnHelper } from '../host/spawn-helper.js';
export { isProcessAlive } from '../host/process-tree.js';
export { writeFileAtomic } from '../image/atomic-file.js';
