import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { readMounts } from '../host/mounts.js';
import { PID_SPACE, processGone, processStartTime } from '../host/process-owner.js';

/**
 * Scratch of image work (imports, builds, blobs before they are hashed into the store) lives in
 * the store's tmp dir under names that say which process owns it: `<kind>-<pid>.<start>.<space>-<rest>`
 * (host/process-owner.ts: the start time tells a reused pid apart, the pid space keeps a process
 * of another host sharing the directory, or of another container, from being judged). Several processes share the store (a `dsec up`
 * and CLI imports and builds beside it); a process killed mid-import leaves its scratch behind,
 * and whoever opens the store next removes the scratch of owners that are gone.
 */

const ownStart = processStartTime(process.pid) ?? '0';

/** The name prefix of scratch this process owns: `<kind>-<pid>.<start>.<space>-`. */
export function stagingPrefix(kind: string): string {
  return `${kind}-${process.pid}.${ownStart}.${PID_SPACE}-`;
}

/** Scratch names that carry an owner. */
export const OWNED_STAGING = /^[a-z]+-(\d+)\.(\d+)\.([0-9a-f]{12})-/;

/** Whether a scratch name carries an owner, and that owner is gone. Names without one are left alone. */
export function stagingOwnerGone(name: string): boolean {
  const m = OWNED_STAGING.exec(name);
  return m ? processGone(m[3]!, Number(m[1]), m[2]!) : false;
}

/** Removes the scratch in `dir` whose owner process is gone; returns the names removed. */
export function sweepDeadStaging(dir: string): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const dead = names.filter(stagingOwnerGone);
  if (dead.length === 0) return [];
  // Never remove through a mount (debootstrap mounts /proc and /sys in its target): such scratch
  // stays for an operator, as it did before.
  const mounts = readMounts().map((m) => m.mountPoint);
  const removed: string[] = [];
  for (const name of dead) {
    const path = join(dir, name);
    if (mounts.some((mp) => mp === path || mp.startsWith(`${path}/`))) continue;
    rmSync(path, { recursive: true, force: true });
    removed.push(name);
  }
  return removed;
}
