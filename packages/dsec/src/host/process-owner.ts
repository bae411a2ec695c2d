import { createHash } from 'node:crypto';
import { readFileSync, readlinkSync } from 'node:fs';

/**
 * Who owns a thing that must not outlive its owner process (a build's scratch, a build's
 * sandboxes): the process's pid with its start time (clock ticks since boot, /proc/<pid>/stat
 * field 22), so a reused pid is not taken for the owner, and where its pid means something: a
 * hash of the host's boot id and the pid namespace, so a process elsewhere (another host sharing
 * a layer directory, another container, a later boot) is never judged by a /proc that cannot
 * see it.
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

function pidSpace(): string {
  let boot = 'unknown';
  let ns = 'unknown';
  try {
    boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    ns = readlinkSync('/proc/self/ns/pid');
  } catch {
    // not Linux: nothing is ever judged gone
  }
  return createHash('sha256').update(`${boot} ${ns}`).digest('hex').slice(0, 12);
}

/** Where this process's pids are meaningful: 12 hex digits of the boot id and pid namespace. */
export const PID_SPACE = pidSpace();

/** This process as an owner: `<pid space>/<pid>.<start time>` (short enough for a label value). */
export function ownerTag(): string {
  return `${PID_SPACE}/${process.pid}.${processStartTime(process.pid) ?? '0'}`;
}

/** Whether the process `pid` that started at `start` in pid space `space` is known to be gone. */
export function processGone(space: string, pid: number, start: string): boolean {
  return space === PID_SPACE && processStartTime(pid) !== start;
}

/**
 * Whether the owner named by `tag` is known to be gone: true only for a tag of this pid space
 * whose process no longer runs (or is another process with its pid); false when it runs, when the
 * tag is of another host, container or boot, or when it does not parse.
 */
export function ownerGone(tag: string): boolean {
  const m = /^([0-9a-f]{12})\/(\d+)\.(\d+)$/.exec(tag);
  return m ? processGone(m[1]!, Number(m[2]), m[3]!) : false;
}
