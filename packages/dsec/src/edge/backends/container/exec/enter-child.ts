import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { CGROUP_PARENT } from '../../../../host/cgroups.js';
import type { FdPlan } from '../../../../host/helper-child.js';
import type { SpawnHelper } from '../../../../host/spawn-helper.js';
import { capabilityMask, DEFAULT_CAPABILITIES, LANDLOCK_PATH, SANDBOX_NOFILE, type ProcessSpec } from '../oci-config.js';
import type { ExecChild } from './crun-exec-child.js';

/**
 * How a command can start in a sandbox without crun: its init's host pid and the seccomp program
 * crun loaded for it at create (the same BPF, precompiled). Absent for a sandbox whose filter crun
 * compiled itself from the profile (the edge could not precompile it): those start through
 * `crun exec`, never without their filter.
 */
export interface EnterTarget {
  initPid: number;
  seccompFile: string;
  /** The sandbox's cgroup in each hierarchy (host/cgroups.ts sandboxCgroupDirs), read once when it became live. */
  cgroupDirs: string[];
}

export interface EnterOptions {
  sandboxId: string;
  enter: EnterTarget;
  process: Pick<ProcessSpec, 'args' | 'env' | 'cwd' | 'user'>;
  /** A pipe for stdin (else /dev/null). */
  stdin: boolean;
  /** The command's whole stdin, known at its start (at most PLAN_DATA_MAX bytes): in a pipe the helper fills, instead of `stdin`'s. */
  stdinData?: Buffer | undefined;
  /** A third output pipe as the command's fd 3. */
  fd3: boolean;
  /** The command's own cgroup2 directory (command-cgroups.ts), where it starts instead of the sandbox's cgroup2 one. */
  commandCgroup?: string | undefined;
  oomScoreAdj: number;
  /**
   * Set up everything but the command, then wait for its cwd, argv and environment on a pipe of
   * their own after the others (the ExecChild's last stdio entry; standbySpec() writes it): an
   * exec's process made ahead (exec-standby.ts). `process.args` and `env` are not used then.
   */
  standby?: boolean;
}

/** What a standby (EnterOptions.standby) is sent to become its command: `<cwd>\0` then enterSpec's. */
export function standbySpec(cwd: string, args: readonly string[], env: readonly string[]): Buffer {
  return Buffer.concat([Buffer.from(`${cwd}\0`), enterSpec(args, env)]);
}

const CAPS = capabilityMask(DEFAULT_CAPABILITIES);

/** dsec-enter's spec file: `<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...` (native/enter.c). */
export function enterSpec(args: readonly string[], env: readonly string[]): Buffer {
  return Buffer.from([String(args.length), ...args, String(env.length), ...env].map((s) => `${s}\0`).join(''));
}

/**
 * A command's argv as processSpecFor made it (exec-target.ts), split into the Landlock domain
 * dsec-landlock would apply (`--isolate`, or `--rw PATH`...) and the command itself: the starter
 * applies the domain in the command's own process (native/landlock-domain.c) instead of an exec
 * of dsec-landlock. An argv that does not start with dsec-landlock has no domain.
 */
export function splitLandlock(args: readonly string[]): { landlock: string[]; args: string[] } {
  if (args[0] !== LANDLOCK_PATH) return { landlock: [], args: [...args] };
  const end = args.indexOf('--');
  const flags = args.slice(1, end < 0 ? args.length : end);
  const command = end < 0 ? [] : args.slice(end + 1);
  if (flags.length === 1 && flags[0] === '--isolate') return { landlock: ['--landlock', 'isolate'], args: command };
  const rw: string[] = [];
  for (let i = 0; i < flags.length; i += 2) {
    // Only what processSpecFor writes; anything else is a bug of the edge's, not a command to run unconfined.
    if (flags[i] !== '--rw' || flags[i + 1] === undefined) throw new Error(`dsec-landlock arguments not understood: ${flags.join(' ')}`);
    rw.push('--rw', flags[i + 1]!);
  }
  return { landlock: ['--landlock', 'rw', ...rw], args: command };
}

/**
 * Starts a command in a running container sandbox through the edge's dsec-spawn (its `enter`
 * request: a fork of the helper does what dsec-enter does, native/spawn-enter.c): what `crun exec
 * --process` would give the command (the sandbox's cgroups and namespaces, the user, dsec's
 * capabilities and RLIMIT_NOFILE, no_new_privs, the sandbox's seccomp program, HOME) and the
 * Landlock domain and command cgroup dsec-landlock would give it, without crun's start-up and
 * with the command's exec the only one. The same fd plan and exit status as startCrunExec, so
 * the exec engine drives both alike; the command's host pid is its starter's child (commandPid).
 */
export function startEnter(spawner: SpawnHelper, opts: EnterOptions): ExecChild {
  const { landlock, args } = splitLandlock(opts.process.args);
  // The command's cgroup2 directory is below the sandbox's: the command goes there instead (in
  // the v1 hierarchies, to the sandbox's own), so it starts in it as dsec-landlock's move put it.
  // The sandbox's own list is sent as it is (dsec-spawn keeps those files open from the sandbox's
  // first command on: native/spawn-sandboxes.c) and the command's directory beside it.
  const own = opts.commandCgroup;
  const cgroupDirs = opts.enter.cgroupDirs;
  const ownPlace =
    own === undefined
      ? []
      : cgroupDirs.includes(dirname(own))
        ? ['--command-cgroup', own]
        : cgroupDirs.includes(own)
          ? []
          : ['--cgroup-dir', own];
  const options = [
    '--pid',
    String(opts.enter.initPid),
    '--cgroup',
    `/${CGROUP_PARENT}/${opts.sandboxId}`,
    '--uid',
    String(opts.process.user.uid),
    '--gid',
    String(opts.process.user.gid),
    '--cwd',
    opts.process.cwd,
    '--caps',
    CAPS,
    '--nofile',
    String(SANDBOX_NOFILE),
    '--seccomp',
    opts.enter.seccompFile,
    ...landlock,
    ...cgroupDirs.flatMap((d) => ['--cgroup-dir', d]),
    ...ownPlace,
    ...(opts.standby ? ['--standby', '1'] : []),
  ];
  const plan: FdPlan[] = [opts.stdinData ? { data: opts.stdinData } : opts.stdin ? 'in' : 'null', 'out', 'out'];
  if (opts.fd3) plan.push('out');
  if (opts.standby) plan.push('in');
  // A standby's argv is sent later (standbySpec); the request's own must not be empty.
  return spawner.enter(options, { args: opts.standby ? ['-'] : args, env: opts.standby ? [] : opts.process.env }, plan, {
    oomScoreAdj: opts.oomScoreAdj,
  });
}

/**
 * The host pid of the command a starter (the HelperChild's pid) started: its one child, while it
 * waits for it. Read when needed (a signal, a kill) instead of a pid file written for every command
 * (a file created, then removed, per command). Undefined before the fork and after the command's
 * exit, when there is nothing left to signal through it.
 */
export function commandPid(starter: number | undefined): number | undefined {
  if (starter === undefined) return undefined;
  try {
    const first = readFileSync(`/proc/${starter}/task/${starter}/children`, 'utf8').trim().split(' ')[0];
    return first ? Number(first) : undefined;
  } catch {
    return undefined; // exited
  }
}
