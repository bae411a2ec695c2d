import { fileURLToPath } from 'node:url';

/**
 * dsec-landlock, the static binary scripts/setup builds from native/landlock-exec.c into
 * dist/native/ (two levels above this module in dist/src/host/); the edge bind-mounts it into
 * every sandbox.
 */
export const LANDLOCK_BINARY = fileURLToPath(new URL('../../native/dsec-landlock', import.meta.url));
