import { randomBytes } from 'node:crypto';
import type { SandboxLimits } from '../edge/protocol/edge-api.js';

/** Limits of a sandbox whose spec gives none. */
export const DEFAULT_LIMITS: SandboxLimits = { cpu: 1, memoryMiB: 512, pids: 512 };

/** `sb-<edge>-<random>`: the edge is in the id, so routing a call needs no lookup. */
export function newSandboxId(edge: string): string {
  return `sb-${edge}-${randomBytes(8).readBigUInt64BE().toString(36).padStart(13, '0')}`;
}

export function edgeOf(id: string): string | undefined {
  return /^sb-([a-z0-9]{1,32})-[a-z0-9]+$/.exec(id)?.[1];
}
