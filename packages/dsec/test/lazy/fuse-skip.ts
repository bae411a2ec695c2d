import { existsSync } from 'node:fs';
import { CHUNK_FUSE_BINARY } from '../../src/host/native-helpers.js';

/** Why a test of the FUSE chunk store cannot run here, or undefined when it can. */
export function fuseSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (FUSE mounts)';
  if (!existsSync('/dev/fuse')) return 'no /dev/fuse in this kernel';
  if (!existsSync(CHUNK_FUSE_BINARY)) return `${CHUNK_FUSE_BINARY} is not built (run ./scripts/setup)`;
  return undefined;
}
