import { readFileSync } from 'node:fs';
import { Sandbox } from '@dsec/sdk';
import type { SandboxBackend } from '@dsec/sdk/schema';
import type { ScenarioContext } from './scenario.js';

/**
 * Idle host memory per sandbox with N of them held at once (`dsec bench vm --held 1,10,50`): a
 * microVM restored from its image's snapshot (whose unchanged RAM pages its siblings share in
 * the host's page cache), a cold-booted microVM, and a container. Two readings, neither perfect:
 * the sandboxes' cgroup charges (a shared page is charged once, to whoever touched it first, so
 * the average over N is the per-sandbox share) and the drop of the host's MemAvailable over the N
 * (everything, also what lies outside the cgroups, but other tenants of the host move it too).
 */

export type HeldKind = 'container' | 'microvm' | 'microvm-cold';

export interface HeldFigures {
  kind: HeldKind;
  held: number;
  /** Average cgroup charge per sandbox after the settle, MiB. */
  cgroupMiB: number;
  /** MemAvailable before the first create minus after the settle, over the sandboxes held, MiB. */
  memAvailableDropMiB: number;
  /** Sandboxes actually held (a failed create is an error, not a sandbox). */
  made: number;
  errors: string[];
}

/** Guest RAM of the held microVMs: 50 of them must fit the placement's RAM + overhead per VM. */
export const HELD_GUEST_MIB = 128;

function memAvailable(): number {
  const m = /MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
}

const mib = (bytes: number): number => Math.round((bytes / (1 << 20)) * 10) / 10;

/**
 * Holds `held` sandboxes of `kind` (each has run `true`), lets them settle, reads their memory
 * and kills them. A cold-booted microVM is one made with the edge's image snapshots off
 * (DSEC_VM_SNAPSHOTS=0, read at each create by the in-process edge).
 */
export async function holdAndMeasure(
  conn: { url: string; apiKey: string },
  kind: HeldKind,
  held: number,
  settleS: number,
  ctx: ScenarioContext,
): Promise<HeldFigures> {
  const backend: SandboxBackend = kind === 'container' ? 'container' : 'microvm';
  const resources = { memoryMiB: HELD_GUEST_MIB, cpu: 1 };
  const errors: string[] = [];
  const sandboxes: Sandbox[] = [];
  const cold = kind === 'microvm-cold';
  const previous = process.env['DSEC_VM_SNAPSHOTS'];
  const previousMax = process.env['DSEC_MAX_VMS'];
  if (cold) process.env['DSEC_VM_SNAPSHOTS'] = '0';
  // The edge's VM slots (4 per CPU by default) would stop the series short of `held`.
  if (kind !== 'container') process.env['DSEC_MAX_VMS'] = String(Math.max(Number(previousMax) || 0, held + 2));
  try {
    // The image's snapshot is made by its first create: made here, outside the reading.
    if (kind === 'microvm') await (await Sandbox.create({ ...conn, backend, resources, labels: { bench: 'vm' } })).kill();
    const before = memAvailable();
    for (let i = 0; i < held && !ctx.signal.aborted; i++) {
      try {
        const sb = await Sandbox.create({ ...conn, backend, resources, labels: { bench: 'vm' } });
        sandboxes.push(sb);
        const r = await sb.commands.run(['true']);
        if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
      } catch (err) {
        errors.push((err as Error).message);
      }
    }
    await new Promise((r) => setTimeout(r, settleS * 1000));
    let charged = 0;
    for (const sb of sandboxes) charged += (await sb.refresh()).usage?.memoryBytes ?? NaN;
    const drop = before - memAvailable();
    const n = sandboxes.length;
    return { kind, held, made: n, cgroupMiB: n ? mib(charged / n) : NaN, memAvailableDropMiB: n ? mib(drop / n) : NaN, errors };
  } finally {
    if (previousMax === undefined) delete process.env['DSEC_MAX_VMS'];
    else process.env['DSEC_MAX_VMS'] = previousMax;
    if (cold) {
      if (previous === undefined) delete process.env['DSEC_VM_SNAPSHOTS'];
      else process.env['DSEC_VM_SNAPSHOTS'] = previous;
    }
    for (const sb of sandboxes) await sb.kill().catch((e: Error) => errors.push(`kill: ${e.message}`));
  }
}
