import { existsSync, mkdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CGROUP_PARENT, CGROUP_ROOT, cgroup2CpuUsec } from './cgroups.js';

/**
 * Whether the cgroup2 hierarchy at `root` kills by cgroup (cgroup.kill, kernel ≥ 5.14), as seen on
 * dsec's parent cgroup there: a property of the kernel and the mount, so looked up once per root,
 * not once per command. A root without dsec's parent yet is looked at again next time.
 */
const killRoots = new Map<string, boolean>();
function canKill(root: string): boolean {
  let yes = killRoots.get(root);
  if (yes === undefined) {
    if (!existsSync(join(root, CGROUP_PARENT))) return false;
    killRoots.set(root, (yes = existsSync(join(root, CGROUP_PARENT, 'cgroup.kill'))));
  }
  return yes;
}

/**
 * A command's own cgroup: a cgroup2 directory under the sandbox's, with no controllers (the
 * sandbox's limits stay where they are, in its own cgroups), used for membership alone. Every
 * process the command starts is born in it and cannot leave (cgroupfs is read-only inside), so
 * `cgroup.kill` ends all of them at once: a timed-out command's double-forked child, or one that
 * dropped the environment tag, included.
 *
 * On the hybrid layout (v1 controllers, cgroup2 at /sys/fs/cgroup/unified) crun puts each
 * sandbox in the cgroup2 hierarchy as well; `crun exec --cgroup` is not used because on that
 * layout it moves the process out of the sandbox's v1 cgroups (its memory limit) too.
 */
export class CommandCgroup {
  private constructor(
    readonly dir: string,
    /** Made by this open (so nothing has run in it yet), not one a session's earlier command made. */
    readonly fresh: boolean,
  ) {}

  /**
   * The command cgroup `name` of a sandbox (created, or reused by a session's later commands), or
   * undefined when this host cannot kill by cgroup (no cgroup2 with cgroup.kill, kernel < 5.14).
   */
  static open(sandboxId: string, name: string, opts: { create: boolean } = { create: true }): CommandCgroup | undefined {
    for (const root of [join(CGROUP_ROOT, 'unified'), CGROUP_ROOT]) {
      if (!canKill(root)) continue;
      const sandbox = join(root, CGROUP_PARENT, sandboxId);
      const dir = join(sandbox, name);
      if (!opts.create) {
        if (existsSync(dir)) return new CommandCgroup(dir, false);
        continue;
      }
      // Made without first looking (a stat per command): a root without the sandbox fails ENOENT.
      try {
        mkdirSync(dir);
        return new CommandCgroup(dir, true);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EEXIST') return new CommandCgroup(dir, false);
        if (code === 'ENOENT') continue;
        return undefined;
      }
    }
    return undefined;
  }

  get name(): string {
    return this.dir.slice(this.dir.lastIndexOf('/') + 1);
  }

  /**
   * Its cgroup.procs: the edge opens it for writing and hands the fd to the command's first
   * process (dsec-landlock --cgroup-fd), which writes "0" to move itself in before anything else
   * runs. The kernel checks that move against the opener's credentials and cgroup namespace.
   */
  get procsFile(): string {
    return join(this.dir, 'cgroup.procs');
  }

  /** CPU time, in microseconds, used by every process that has been in the cgroup (cpu.stat). */
  cpuUsec(): number | undefined {
    return cgroup2CpuUsec(this.dir);
  }

  /** SIGKILLs every process in the cgroup, in one step the processes cannot race. */
  kill(): void {
    try {
      writeFileSync(join(this.dir, 'cgroup.kill'), '1');
    } catch {
      // removed already (the sandbox is gone)
    }
  }

  /** Removes the cgroup if it is empty; one still holding background jobs stays for the sandbox's teardown. */
  remove(): void {
    try {
      rmdirSync(this.dir);
    } catch {
      // busy (jobs left running) or gone
    }
  }
}
