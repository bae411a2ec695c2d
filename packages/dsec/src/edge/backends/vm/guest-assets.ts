import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** Where scripts/build-vm-guest puts the guest: dist/vm/, four levels above dist/src/edge/backends/vm/. */
const VM_DIR = fileURLToPath(new URL('../../../../vm/', import.meta.url));

export interface GuestAssets {
  kernel: string;
  initramfs: string;
  kernelVersion: string;
}

/** The guest kernel and initramfs, or why there are none (set-up not run). */
export function guestAssets(): GuestAssets | { missing: string } {
  const kernel = VM_DIR + 'vmlinuz';
  const initramfs = VM_DIR + 'initramfs.cpio';
  if (!existsSync(kernel) || !existsSync(initramfs)) {
    return {
      missing: `no VM guest in ${VM_DIR} (kernel and initramfs); run ./scripts/setup, which builds them with scripts/build-vm-guest`,
    };
  }
  let kernelVersion = 'unknown';
  try {
    kernelVersion = readFileSync(VM_DIR + 'kernel-version', 'utf8').trim();
  } catch {
    // built before the version file existed; the kernel still boots
  }
  return { kernel, initramfs, kernelVersion };
}

export const QEMU_BINARY = 'qemu-system-x86_64';
