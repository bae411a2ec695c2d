import { readFileSync } from 'node:fs';

/**
 * Who owns a thing that must not outlive its owner process (a build's scratch, a build's
 * sandboxes): the process's pid with its start time (clock ticks since boot, /proc/<pid>/stat
 * field 22), so a reused pid is not taken for the owner, and the host's boot id, so a control
 * plane on another host (or after a reboot) does not judge a process it cannot see.
 */

/** The process's start time as the kernel records it; undefined when it is gone. */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return 'unknown';
  }
}

const BOOT_ID = bootId();

/** This process as an owner: `<boot id>/<pid>.<start time>` (under 64 characters: a label value). */
export function ownerTag(): string {
  return `${BOOT_ID}/${process.pid}.${processStartTime(process.pid) ?? '0'}`;
}

/**
 * Whether the owner named by `tag` is known to be gone: true only for a tag of this host's boot
 * whose process no longer runs (or is another process with its pid); false when it runs, when the
 * tag is of another host or boot, or when it does not parse.
 */
export function ownerGone(tag: string): boolean {
  const m = /^([0-9a-f-]{36})\/(\d+)\.(\d+)$/.exec(tag);
  if (!m || m[1] !== BOOT_ID) return false;
  return processStartTime(Number(m[2])) !== m[3];
}
