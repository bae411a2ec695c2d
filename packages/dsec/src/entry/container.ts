/**
 * Entry point `dsec/container`, for a peer that builds the very container dsec builds, by hand:
 * the benchmark's raw-crun floor (`packages/bench`, peers/crun-raw.ts), its fn-call floor and its
 * hardening arms. The OCI config, mounts (overlay, idmapped root, stubs), the sandbox's paths,
 * crun, seccomp and the network ruleset, from the same code the edge uses, so the floor differs
 * from dsec only by what dsec adds around it. Such a peer may still drive crun directly.
 */
export { Crun } from '../edge/backends/container/crun.js';
export type { SandboxLimits } from '../edge/protocol/edge-api.js';
export { buildOciConfig, cgroupNames, LANDLOCK_PATH, MASKED_PATHS, SECCOMP_BPF_ANNOTATION } from '../edge/backends/container/oci-config.js';
export { existingDirs, prepareMountStubs, type MountStubs } from '../edge/backends/container/mount-stubs.js';
export { mountOverlay } from '../edge/backends/container/overlay.js';
export { unmountSandboxDir } from '../edge/backends/container/sandbox-unmount.js';
export { makeUserns, mountIdmappedRoot } from '../edge/backends/container/idmapped-root.js';
export { SandboxPaths } from '../edge/backends/container/sandbox-record.js';
export { LayerMounts, tryUnmount } from '../edge/node/layer-mounts.js';
export { defaultSeccompProfile } from '../edge/backends/container/seccomp.js';
export { compileSeccompProfile } from '../edge/backends/container/seccomp-bpf.js';
export { sandboxRuleset, type NetworkPolicy } from '../net/policy.js';
