/** Whether this host runs microVM/VM sandboxes in tests, and the engine suite's backends. */
import { which } from '../../src/host/doctor.js';
import { guestAssets } from '../../src/edge/backends/vm/guest-assets.js';
import { integrationSkipReason } from './server.js';

/** Why VM tests cannot run here (no QEMU, no guest built), or undefined when they can. */
export function vmSkipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (!which('qemu-system-x86_64')) return 'VM tests need qemu-system-x86_64 (scripts/setup installs it)';
  const g = guestAssets();
  if ('missing' in g) return g.missing;
  return undefined;
}

export type EngineBackend = 'container' | 'microvm';

/**
 * The backends the shared engine suite (test/engine/) runs against, each with its skip reason:
 * containers, and a microVM (QEMU under TCG here: one boot per suite file) where this host can
 * run one. DSEC_ENGINE_BACKENDS=container (or microvm) runs one of them only.
 */
export function engineBackends(): { backend: EngineBackend; skip: string | undefined; memoryMiB: number }[] {
  const only = process.env['DSEC_ENGINE_BACKENDS']?.split(',').map((s) => s.trim());
  const all: { backend: EngineBackend; skip: string | undefined; memoryMiB: number }[] = [
    { backend: 'container', skip: integrationSkipReason(), memoryMiB: 128 },
    // A guest kernel wants more than a container: 256 MiB as in vm.test.ts.
    { backend: 'microvm', skip: vmSkipReason(), memoryMiB: 256 },
  ];
  return all.map((b) =>
    only && !only.includes(b.backend) ? { ...b, skip: `DSEC_ENGINE_BACKENDS=${only.join(',')} leaves ${b.backend} out` } : b,
  );
}

/** A test's skip option when it checks something only a container has (the reason is printed). */
export function containerOnly(backend: EngineBackend, why: string): { skip?: string } {
  return backend === 'container' ? {} : { skip: `${backend}: ${why}` };
}
