import type { Check } from '../host/doctor.js';
import { which } from '../host/doctor.js';
import { chooseAccel } from '../edge/backends/vm/accel-probe.js';
import { guestAssets } from '../edge/backends/vm/guest-assets.js';

/**
 * `dsec doctor`'s line on microVM/VM sandboxes: whether they can run here, and with which QEMU
 * accelerator (KVM when the guest kernel boots under it, else TCG) and why. Not required:
 * containers run without it.
 */
export async function vmCheck(): Promise<Check> {
  const name = 'microVM/VM sandboxes';
  if (!which('qemu-system-x86_64'))
    return { name, ok: false, detail: 'no qemu-system-x86_64 (Debian qemu-system-x86; scripts/setup installs it)', required: false };
  const g = guestAssets();
  if ('missing' in g) return { name, ok: false, detail: g.missing, required: false };
  const a = await chooseAccel(g);
  return { name, ok: true, detail: `${a.accel.toUpperCase()} (${a.reason}); guest kernel ${g.kernelVersion}`, required: false };
}
