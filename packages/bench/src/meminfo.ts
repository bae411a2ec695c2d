import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** The /proc/meminfo fields a per-sandbox memory figure is made of, in KiB. */
export interface MemSnapshot {
  memAvailableKiB: number;
  memFreeKiB: number;
  slabKiB: number;
  sUnreclaimKiB: number;
  kernelStackKiB: number;
  pageTablesKiB: number;
}

const FIELDS: Record<string, keyof MemSnapshot> = {
  MemAvailable: 'memAvailableKiB',
  MemFree: 'memFreeKiB',
  Slab: 'slabKiB',
  SUnreclaim: 'sUnreclaimKiB',
  KernelStack: 'kernelStackKiB',
  PageTables: 'pageTablesKiB',
};

export function readMeminfo(text = readFileSync('/proc/meminfo', 'utf8')): MemSnapshot {
  const snap: MemSnapshot = { memAvailableKiB: 0, memFreeKiB: 0, slabKiB: 0, sUnreclaimKiB: 0, kernelStackKiB: 0, pageTablesKiB: 0 };
  for (const line of text.split('\n')) {
    const m = /^(\w+):\s+(\d+)/.exec(line);
    const key = m && FIELDS[m[1]!];
    if (key) snap[key] = Number(m[2]);
  }
  return snap;
}

/** How much more of each field `after` uses than `before` (MemAvailable/MemFree: how much less is free). */
export function memUsed(before: MemSnapshot, after: MemSnapshot): MemSnapshot {
  return {
    memAvailableKiB: before.memAvailableKiB - after.memAvailableKiB,
    memFreeKiB: before.memFreeKiB - after.memFreeKiB,
    slabKiB: after.slabKiB - before.slabKiB,
    sUnreclaimKiB: after.sUnreclaimKiB - before.sUnreclaimKiB,
    kernelStackKiB: after.kernelStackKiB - before.kernelStackKiB,
    pageTablesKiB: after.pageTablesKiB - before.pageTablesKiB,
  };
}

export function addMem(a: MemSnapshot, b: MemSnapshot): MemSnapshot {
  const out = { ...a };
  for (const k of Object.keys(out) as (keyof MemSnapshot)[]) out[k] += b[k];
  return out;
}

export const ZERO_MEM: MemSnapshot = {
  memAvailableKiB: 0,
  memFreeKiB: 0,
  slabKiB: 0,
  sUnreclaimKiB: 0,
  kernelStackKiB: 0,
  pageTablesKiB: 0,
};

/**
 * The in-process server's JS heap is part of dsec's cost, but garbage not yet collected is not:
 * a full GC before each reading keeps the V8 heap at what is really retained.
 */
let gc: (() => void) | undefined;
function collectGarbage(): void {
  if (!gc) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
  }
  gc();
}

/** A reading after the host has had `settleMs` to finish lazy work (RCU frees, deferred slab). */
export async function settledMeminfo(settleMs = 1000): Promise<MemSnapshot> {
  collectGarbage();
  await new Promise((r) => setTimeout(r, settleMs));
  collectGarbage();
  return readMeminfo();
}
