import { fileURLToPath } from 'node:url';

/** Where scripts/setup puts the native helpers: dist/native/, two levels above dist/src/host/. */
const NATIVE_DIR = new URL('../../native/', import.meta.url);

/**
 * dsec-landlock, the static binary scripts/setup builds from native/landlock-exec.c; the edge
 * bind-mounts it into every sandbox.
 */
export const LANDLOCK_BINARY = fileURLToPath(new URL('dsec-landlock', NATIVE_DIR));

/** dsec-nft (native/nft-helper.c): the edge's resident nftables helper, linked against libnftables. */
export const NFT_HELPER_BINARY = fileURLToPath(new URL('dsec-nft', NATIVE_DIR));

/** dsec-chunk-fuse (native/chunk-fuse.c): the node's lazy layer store (FUSE over HTTP range requests, libfuse3 + libcurl). */
export const CHUNK_FUSE_BINARY = fileURLToPath(new URL('dsec-chunk-fuse', NATIVE_DIR));

/** dsec-seccomp-bpf (native/seccomp-bpf.c): compiles a seccomp profile to BPF with libseccomp, once per edge. */
export const SECCOMP_BPF_BINARY = fileURLToPath(new URL('dsec-seccomp-bpf', NATIVE_DIR));

/**
 * dsec-idmap (native/idmap-mount.c): makes a user-namespaced sandbox's user namespace and mounts
 * its root (an overlay over id-mapped clones of the shared layers) and its volumes, id-mapped.
 */
export const IDMAP_BINARY = fileURLToPath(new URL('dsec-idmap', NATIVE_DIR));

/**
 * dsec-spawn (native/spawn-helper.c): the edge's resident tool starter (posix_spawn), so the edge
 * does not fork per crun call, and the starter of its commands in container sandboxes (`enter`).
 */
export const SPAWN_HELPER_BINARY = fileURLToPath(new URL('dsec-spawn', NATIVE_DIR));

/**
 * dsec-enter (native/enter.c): starts a command in a running container sandbox as `crun exec`
 * does (its cgroups, namespaces, user, capabilities, seccomp program), without crun's start-up.
 * The edge runs the same steps in a fork of dsec-spawn (its `enter` request) instead; the binary
 * is for a start by hand and for the tests that drive the checks with inputs the edge never gives.
 */
export const ENTER_BINARY = fileURLToPath(new URL('dsec-enter', NATIVE_DIR));
