import { writeFileSync } from 'node:fs';
import { CGROUP_PARENT } from '../../../../host/cgroups.js';
import type { FdPlan } from '../../../../host/helper-child.js';
import { ENTER_BINARY } from '../../../../host/native-helpers.js';
import type { SpawnHelper } from '../../../../host/spawn-helper.js';
import { capabilityMask, DEFAULT_CAPABILITIES, SANDBOX_NOFILE, type ProcessSpec } from '../oci-config.js';
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
  /** Where the command's argv and environment are written for dsec-enter (a file of the edge's, 0600). */
  specFile: string;
  pidFile: string;
  /** A pipe for stdin (else /dev/null). */
  stdin: boolean;
  /** A third output pipe as the command's fd 3. */
  fd3: boolean;
  /** A host file opened for writing and handed to the command as the fd after those (its command cgroup's cgroup.procs). */
  writeFile?: string | undefined;
  oomScoreAdj: number;
}

const CAPS = capabilityMask(DEFAULT_CAPABILITIES);

/** dsec-enter's spec file: `<argc>\0<arg>\0...<envc>\0<KEY=VALUE>\0...` (native/enter.c). */
export function enterSpec(args: readonly string[], env: readonly string[]): Buffer {
  return Buffer.from([String(args.length), ...args, String(env.length), ...env].map((s) => `${s}\0`).join(''));
}

/**
 * Starts a command in a running container sandbox with dsec-enter (native/enter.c), started by
 * the edge's dsec-spawn: what `crun exec --process` would give the command (the sandbox's
 * cgroups and namespaces, the user, dsec's capabilities and RLIMIT_NOFILE, no_new_privs, the
 * sandbox's seccomp program, HOME) without crun's own start-up, which is most of an exec's cost.
 * The same fd plan, pid file and exit status as startCrunExec, so the exec engine drives both alike.
 */
export function startEnter(spawner: SpawnHelper, opts: EnterOptions): ExecChild {
  writeFileSync(opts.specFile, enterSpec(opts.process.args, opts.process.env), { mode: 0o600 });
  const preserved = (opts.fd3 ? 1 : 0) + (opts.writeFile ? 1 : 0);
  const args = [
    '--pid',
    String(opts.enter.initPid),
    '--cgroup',
    `/${CGROUP_PARENT}/${opts.sandboxId}`,
    '--spec',
    opts.specFile,
    '--pid-file',
    opts.pidFile,
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
    '--preserve-fds',
    String(preserved),
    ...opts.enter.cgroupDirs.flatMap((d) => ['--cgroup-dir', d]),
  ];
  const plan: FdPlan[] = [opts.stdin ? 'in' : 'null', 'out', 'out'];
  if (opts.fd3) plan.push('out');
  if (opts.writeFile) plan.push({ write: opts.writeFile });
  return spawner.stream(ENTER_BINARY, args, plan, { oomScoreAdj: opts.oomScoreAdj });
}
