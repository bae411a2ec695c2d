import { runToolOrThrow } from '../host/run-tool.js';

/**
 * A VM's tap inside the VM's own network namespace (QEMU runs in it and makes the tap). The
 * link-local /30 169.254.0.0/30 is the same in every VM's netns: the sandbox links never use
 * third octet 0 (address-pool.ts), nothing outside a VM's netns sees it (its traffic leaves
 * masqueraded to the link's sandbox address), and a VM restored from a snapshot keeps its address.
 */
export const VM_TAP = { name: 'dvt0', netns: '169.254.0.1', guest: '169.254.0.2', prefix: 30 } as const;

/** The guest's kernel command line for its address (the guest agent configures eth0 from it). */
export function guestNetworkArgs(): string[] {
  return [`dsec.ip=${VM_TAP.guest}/${VM_TAP.prefix}`, `dsec.gw=${VM_TAP.netns}`];
}

/**
 * Readies the netns of QEMU process `pid` for the guest's traffic: forwarding on (a new netns
 * starts with it off), the tap's netns-side address, the tap up. QEMU made the tap at its start;
 * what the guest sends before this is lost, and it sends nothing before its agent is ready.
 */
export async function prepareVmNetns(pid: number): Promise<void> {
  await runToolOrThrow('nsenter', [
    `--target=${pid}`,
    '--net',
    '--',
    'sh',
    '-c',
    `echo 1 > /proc/sys/net/ipv4/ip_forward && ` +
      `ip addr replace ${VM_TAP.netns}/${VM_TAP.prefix} dev ${VM_TAP.name} && ip link set ${VM_TAP.name} up`,
  ]);
}
