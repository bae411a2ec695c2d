import { randomBits64 } from '../host/random-bits.js';
import type { SandboxLimits } from '../edge/protocol/edge-api.js';

/** Limits of a sandbox whose spec gives none. */
export const DEFAULT_LIMITS: SandboxLimits = { cpu: 1, memoryMiB: 512, pids: 512 };

/**
 * `sb-<edge>-z<milliseconds><random>`: the edge is in the id, so routing a call needs no lookup.
 * The creation millisecond (9 base-36 digits, good for 3,000 years) comes first so that ids sort
 * by time: the store's indexes on ids (the sandboxes' primary key, their specs') take new rows at
 * their end. With wholly random ids each row of a batch landed on a page of its own, and a group's
 * commit wrote back one index page per sandbox per index. With the second first (ids before
 * 2026-12-07), a second's rows (thousands, under a batch) still went to random places within that
 * second's range, tens of pages: with the millisecond a group's inserts are appends, and a batch's
 * store writes took a third less time (`dsec bench cluster`, docs/BENCHMARKS.md). The `z` sorts
 * them after those older ids (which begin with a digit), so a store that holds both still takes
 * new rows at its indexes' end. 11 random digits (56 bits) keep ids of one millisecond apart.
 */
export function newSandboxId(edge: string): string {
  const ms = Date.now().toString(36).padStart(9, '0');
  const random = (randomBits64() >> 8n).toString(36).padStart(11, '0');
  return `sb-${edge}-z${ms}${random}`;
}

export function edgeOf(id: string): string | undefined {
  return /^sb-([a-z0-9]{1,32})-[a-z0-9]+$/.exec(id)?.[1];
}
