import { randomBits64 } from '../host/random-bits.js';
import type { SandboxLimits } from '../edge/protocol/edge-api.js';

/** Limits of a sandbox whose spec gives none. */
export const DEFAULT_LIMITS: SandboxLimits = { cpu: 1, memoryMiB: 512, pids: 512 };

/**
 * `sb-<edge>-<seconds><random>`: the edge is in the id, so routing a call needs no lookup. The
 * creation second (7 base-36 digits, good for 2,400 years) comes first so that ids sort by time:
 * the store's indexes on ids (the sandboxes' primary key, their specs') take a second's new rows
 * next to each other at their end. With wholly random ids each row of a batch landed on a page of
 * its own, and a group's commit wrote back one index page per sandbox per index (dsec bench
 * cluster, 32,000 in one batch). 11 random digits (56 bits) keep ids of one second apart.
 */
export function newSandboxId(edge: string): string {
  const second = Math.floor(Date.now() / 1000)
    .toString(36)
    .padStart(7, '0');
  const random = (randomBits64() >> 8n).toString(36).padStart(11, '0');
  return `sb-${edge}-${second}${random}`;
}

export function edgeOf(id: string): string | undefined {
  return /^sb-([a-z0-9]{1,32})-[a-z0-9]+$/.exec(id)?.[1];
}
