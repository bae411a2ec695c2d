import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SANDBOX_OOM_SCORE_ADJ } from '../../../host/node-memory.js';
import type { Accel } from './accel-probe.js';
import { guestNetworkArgs, VM_TAP } from '../../../net/vm-network.js';
import { QEMU_BINARY, type GuestAssets } from './guest-assets.js';

export type VmMachine = 'microvm' | 'vm';

/** The files of one VM on the edge (`node/vms/<id>/`); the sockets are QEMU's, only root reaches them. */
export class VmPaths {
  constructor(readonly dir: string) {}
  get state(): string {
    return join(this.dir, 'state.json');
  }
  get disk(): string {
    return join(this.dir, 'upper.img');
  }
  get agentSocket(): string {
    return join(this.dir, 'agent.sock');
  }
  get qmpSocket(): string {
    return join(this.dir, 'qmp.sock');
  }
  get console(): string {
    return join(this.dir, 'console.log');
  }
  get qemuLog(): string {
    return join(this.dir, 'qemu.log');
  }
  /** Where QEMU's migration stream passes (saving this VM's state, or restoring into it). */
  get migrationSocket(): string {
    return join(this.dir, 'migrate.sock');
  }
  /** The VM's latest snapshot (memory and device state, its disk, its record): the source of forks. */
  get snapshotDir(): string {
    return join(this.dir, 'snapshot');
  }
  get snapshotMemory(): string {
    return join(this.snapshotDir, 'state.bin');
  }
  get snapshotDisk(): string {
    return join(this.snapshotDir, 'upper.img');
  }
  get snapshotRecord(): string {
    return join(this.snapshotDir, 'record.json');
  }
}

export interface LaunchSpec {
  machine: VmMachine;
  accel: Accel;
  guest: GuestAssets;
  paths: VmPaths;
  /** The image's layer blobs (EROFS files), bottom first. */
  layers: string[];
  vcpus: number;
  memoryMiB: number;
  /** cgroup.procs files QEMU joins before it starts (vm-cgroup.ts). */
  cgroupProcs: string[];
  /** Restore: QEMU waits for a saved state on this unix socket (vm-state.ts) instead of booting. */
  incoming?: string;
  /** Guest RAM as a memory backend of its own (GuestMemory); without it, QEMU's default anonymous RAM. */
  memory?: GuestMemory;
}

/**
 * Guest RAM as the memory backend `mem` (vm-image-snapshot.ts): `file` maps a file (`shared`: the
 * guest writes into it, as the booting guest an image's snapshot is made of does; otherwise a
 * private copy-on-write mapping, so the guests restored from one snapshot share its unchanged
 * pages in the host's page cache), else anonymous RAM (a fork of such a guest: its saved state
 * names the RAM block `mem`). Such a guest has no free page reporting: QEMU 7.2 gives a reported
 * page back by punching a hole in the backing file (ram_block_discard_range: fallocate on any
 * fd-backed block, private or not), which would zero the page in the snapshot every sibling
 * maps; and a restore's balloon must be the one its state was saved with. The snapshot's save and
 * restore skip RAM in a shared file (x-ignore-shared): its pages stay in the file, only devices
 * are streamed.
 */
export interface GuestMemory {
  file?: string;
  shared?: boolean;
}

/**
 * The TSC rate the guest is told under TCG. microvm has no PIT speaker port, HPET or ACPI PM
 * timer, so a stock kernel cannot calibrate its TSC and hangs; TCG's TSC runs at the host's
 * rate, which the host's cpuinfo gives.
 */
function hostTscKhz(): number {
  try {
    const m = /cpu MHz\s*:\s*([\d.]+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    if (m) return Math.round(Number(m[1]) * 1000);
  } catch {
    // fall through
  }
  return 2_000_000;
}

/**
 * QEMU's command line. microvm: virtio-mmio, no firmware, the kernel booted directly. vm: q35
 * with PCI (SeaBIOS, then the same kernel). One virtio-net NIC on a tap in QEMU's own netns
 * (vm-network.ts), where the sandbox's egress policy is enforced, outside the guest.
 * Disks are found by serial in the guest (layer0…, upper), so attachment order does not matter.
 * The guest's only link to the host is the virtio-serial port "dsec.agent".
 */
export function qemuArgs(s: LaunchSpec): string[] {
  const mmio = s.machine === 'microvm';
  const blk = mmio ? 'virtio-blk-device' : 'virtio-blk-pci';
  const append = ['console=ttyS0', 'quiet', 'loglevel=1', 'panic=-1', `dsec.layers=${s.layers.length}`, ...guestNetworkArgs()];
  if (mmio && s.accel === 'tcg') {
    const khz = hostTscKhz();
    append.push(`tsc_early_khz=${khz}`, `lpj=${Math.round((khz * 1000) / 250)}`);
  }
  const machine = mmio ? 'microvm,x-option-roms=off,rtc=on' : 'q35';
  const args = [
    '-name',
    `dsec-${s.paths.dir.split('/').pop()}`,
    '-M',
    s.memory ? `${machine},memory-backend=mem` : machine,
    // TCG's translated-code cache defaults to 1 GiB and is resident once filled; 64 MiB is
    // plenty for one guest kernel plus a workload and keeps an idle VM's host memory down.
    '-accel',
    s.accel === 'tcg' ? 'tcg,tb-size=64' : 'kvm',
    '-cpu',
    s.accel === 'kvm' ? 'host' : 'max',
    '-smp',
    String(s.vcpus),
    '-m',
    String(s.memoryMiB),
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-no-reboot',
    // QEMU's own seccomp filter: no new processes, no privilege changes.
    '-sandbox',
    'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    '-kernel',
    s.guest.kernel,
    '-initrd',
    s.guest.initramfs,
    '-append',
    append.join(' '),
    '-serial',
    `file:${s.paths.console}`,
  ];
  if (s.memory) {
    const size = `size=${s.memoryMiB}M`;
    args.push(
      '-object',
      s.memory.file
        ? `memory-backend-file,id=mem,${size},mem-path=${s.memory.file},share=${s.memory.shared ? 'on' : 'off'}`
        : `memory-backend-ram,id=mem,${size}`,
    );
  }
  s.layers.forEach((file, i) => {
    args.push('-drive', `id=l${i},file=${file},format=raw,if=none,readonly=on`, '-device', `${blk},drive=l${i},serial=layer${i}`);
  });
  args.push(
    '-drive',
    `id=up,file=${s.paths.disk},format=raw,if=none,cache=unsafe,discard=unmap`,
    '-device',
    `${blk},drive=up,serial=upper`,
  );
  // Free page reporting: the guest hands pages it freed back to the host (QEMU discards them),
  // so what boot touched and the guest no longer uses does not stay resident on the host.
  args.push('-device', `${mmio ? 'virtio-balloon-device' : 'virtio-balloon-pci'},free-page-reporting=${s.memory ? 'off' : 'on'}`);
  // QEMU makes the tap in its netns (the edge addresses it once the guest is up); vhost is off
  // (not every host has vhost-net, and TCG gains nothing from it).
  args.push('-netdev', `tap,id=net0,ifname=${VM_TAP.name},script=no,downscript=no,vhost=off`);
  args.push('-device', `${mmio ? 'virtio-net-device' : 'virtio-net-pci'},netdev=net0,mac=52:54:00:d5:ec:02`);
  args.push(
    '-device',
    mmio ? 'virtio-serial-device' : 'virtio-serial-pci',
    '-chardev',
    `socket,id=agent,path=${s.paths.agentSocket},server=on,wait=off`,
    '-device',
    'virtserialport,chardev=agent,name=dsec.agent',
    '-qmp',
    `unix:${s.paths.qmpSocket},server=on,wait=off`,
  );
  // A restore of an image's snapshot sets x-ignore-shared first (QEMU 7.2 has no property for
  // it, only QMP), so the incoming migration waits for migrate-incoming (vm-state.ts).
  if (s.incoming) args.push('-incoming', s.memory?.file ? 'defer' : `unix:${s.incoming}`);
  return args;
}

/**
 * Starts QEMU detached (it outlives an edge restart, which adopts it) in the VM's cgroups and a
 * network namespace of its own: a shell joins the cgroups and execs unshare, which execs QEMU,
 * so the pid is QEMU's, everything it allocates is charged to the VM from its first page, and
 * the netns lives exactly as long as QEMU.
 */
export function launchQemu(s: LaunchSpec): number {
  const log = openSync(s.paths.qemuLog, 'a');
  try {
    // The VM is a sandbox: the OOM killer takes it before dsec, whose lowered score it would inherit.
    const join = `for f in $DSEC_VM_CGROUP_PROCS; do echo $$ > "$f" || exit 111; done; echo ${SANDBOX_OOM_SCORE_ADJ} > /proc/self/oom_score_adj; exec "$@"`;
    const child = spawn('sh', ['-c', join, 'sh', 'unshare', '--net', '--', QEMU_BINARY, ...qemuArgs(s)], {
      detached: true,
      stdio: ['ignore', log, log],
      env: { ...process.env, DSEC_VM_CGROUP_PROCS: s.cgroupProcs.join(' ') },
    });
    child.unref();
    if (!child.pid) throw new Error(`could not start ${QEMU_BINARY}`);
    return child.pid;
  } finally {
    closeSync(log);
  }
}

/** The kernel's flag for its own threads in /proc/<pid>/stat: they have no command line ever. */
const PF_KTHREAD = 0x00200000;

/**
 * Whether pid is this VM's QEMU (and not a recycled pid): its command line names the VM's dir.
 * A pid this edge has just launched passes through two execs (sh → unshare → QEMU), and while
 * the kernel swaps a process's image its command line reads empty: that is a process on its way
 * to being QEMU, not a dead one (CI once failed a boot 68 ms in as "QEMU exited"). So an empty
 * command line counts as this VM's QEMU unless `adopting` (a pid read back from disk after a
 * restart, which may belong to anything by now) or the pid is a kernel thread.
 */
export function isQemuOf(pid: number, paths: VmPaths, opts: { adopting?: boolean } = {}): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after "(comm) ": state is the first, flags the seventh (stat(5): fields 3 and 9).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z' || fields[0] === 'X') return false;
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    if (cmd === '') return !opts.adopting && (Number(fields[6]) & PF_KTHREAD) === 0;
    return cmd.includes(paths.agentSocket);
  } catch {
    return false;
  }
}
