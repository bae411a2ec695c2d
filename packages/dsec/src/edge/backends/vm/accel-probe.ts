import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { release } from 'node:os';
import { dirname } from 'node:path';
import { QEMU_BINARY, type GuestAssets } from './guest-assets.js';

export type Accel = 'kvm' | 'tcg';

export interface AccelChoice {
  accel: Accel;
  /** Why this one: what the probe saw, or the override. */
  reason: string;
}

/** The probe's answer is kept per guest kernel and host kernel, so it runs once per machine. */
const CACHE = process.env['DSEC_VM_CACHE'] ? `${process.env['DSEC_VM_CACHE']}/accel.json` : '/var/cache/dsec/vm/accel.json';
/** How long the guest kernel gets under KVM to print its banner. Under TCG it takes < 0.5 s. */
const PROBE_MS = 4000;

/**
 * KVM when it boots our guest kernel, else TCG. /dev/kvm is not enough: on a PVM host (nested,
 * pagetable-based) it opens, but a stock kernel hangs in its setup code and never prints its
 * banner. So the probe boots the guest kernel under KVM with an early console and waits for
 * "Linux version". DSEC_VM_ACCEL=kvm|tcg overrides.
 */
export async function chooseAccel(guest: GuestAssets): Promise<AccelChoice> {
  const forced = process.env['DSEC_VM_ACCEL'];
  if (forced === 'kvm' || forced === 'tcg') return { accel: forced, reason: `DSEC_VM_ACCEL=${forced}` };
  if (!existsSync('/dev/kvm')) return { accel: 'tcg', reason: 'no /dev/kvm on this host' };
  try {
    accessSync('/dev/kvm', constants.R_OK | constants.W_OK);
  } catch {
    return { accel: 'tcg', reason: '/dev/kvm is not accessible' };
  }
  const key = `${guest.kernelVersion}|${release()}`;
  try {
    const cached = JSON.parse(readFileSync(CACHE, 'utf8')) as { key: string; choice: AccelChoice };
    if (cached.key === key) return cached.choice;
  } catch {
    // no cache yet
  }
  const boots = await kernelBootsUnderKvm(guest);
  const choice: AccelChoice = boots
    ? { accel: 'kvm', reason: 'the guest kernel boots under KVM' }
    : {
        accel: 'tcg',
        reason: `/dev/kvm is present but the guest kernel does not boot under it (no banner within ${PROBE_MS} ms; e.g. a PVM host needs a CONFIG_PVM_GUEST kernel)`,
      };
  try {
    mkdirSync(dirname(CACHE), { recursive: true });
    writeFileSync(CACHE, JSON.stringify({ key, choice }));
  } catch {
    // the probe runs again next time
  }
  return choice;
}

function kernelBootsUnderKvm(guest: GuestAssets): Promise<boolean> {
  return new Promise((resolve) => {
    const child = spawn(
      QEMU_BINARY,
      [
        '-accel',
        'kvm',
        '-M',
        'microvm',
        '-m',
        '128',
        '-nodefaults',
        '-no-user-config',
        '-display',
        'none',
        '-no-reboot',
        '-kernel',
        guest.kernel,
        '-append',
        'console=ttyS0 earlyprintk=ttyS0 panic=-1',
        '-serial',
        'stdio',
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    let out = '';
    let done = false;
    const finish = (ok: boolean): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      resolve(ok);
    };
    const timer = setTimeout(() => finish(false), PROBE_MS);
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      if (out.includes('Linux version')) finish(true);
    });
    child.on('error', () => finish(false));
    child.on('exit', () => finish(out.includes('Linux version')));
  });
}
