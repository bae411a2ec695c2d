import { spawn } from 'node:child_process';
import { closeSync, openSync, writeFileSync } from 'node:fs';
import type { EventEmitter } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import type { FdPlan } from '../../../../host/helper-child.js';
import type { SpawnHelper } from '../../../../host/spawn-helper.js';
import { nullStdio } from '../../../../host/private-null.js';

/** The `crun exec` process of one command, as the exec engine drives it (a ChildProcess or a dsec-spawn HelperChild). */
export interface ExecChild extends EventEmitter {
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  readonly stdio: readonly (Readable | Writable | null | undefined)[];
  readonly exitCode: number | null;
  readonly signalCode: NodeJS.Signals | null;
  kill(signal?: NodeJS.Signals): boolean;
}

export interface CrunExecOptions {
  /** crun's global flags (`--root`) and the `exec` arguments after `--preserve-fds`. */
  globalArgs: readonly string[];
  execArgs: readonly string[];
  /** A pipe for stdin (else /dev/null). */
  stdin: boolean;
  /** A third output pipe as the command's fd 3. */
  fd3: boolean;
  /** A host file handed to the command, opened for writing, as the fd after those (its command cgroup's cgroup.procs). */
  writeFile?: string | undefined;
  /** The OOM score crun exec and the command run at (crun exec does not apply the spec's oomScoreAdj). */
  oomScoreAdj: number;
}

/** The fd the command finds `writeFile` at. */
export function writeFileFd(opts: Pick<CrunExecOptions, 'fd3'>): number {
  return opts.fd3 ? 4 : 3;
}

/**
 * Starts `crun exec` for a command. With the edge's dsec-spawn it is posix_spawn()ed by that
 * small process (Node's own spawn fork()s the edge's whole address space, a few milliseconds on
 * every exec and copy-on-write faults after it), its pipes opened by the edge through /proc;
 * without the helper (not built) Node spawns it.
 */
export function startCrunExec(spawner: SpawnHelper | undefined, opts: CrunExecOptions): ExecChild {
  const extraFds = (opts.fd3 ? 1 : 0) + (opts.writeFile ? 1 : 0);
  const args = [...opts.globalArgs, 'exec', ...(extraFds > 0 ? [`--preserve-fds=${extraFds}`] : []), ...opts.execArgs];
  if (spawner) {
    const plan: FdPlan[] = [opts.stdin ? 'in' : 'null', 'out', 'out'];
    if (opts.fd3) plan.push('out');
    if (opts.writeFile) plan.push({ write: opts.writeFile });
    return spawner.stream('crun', args, plan, { oomScoreAdj: opts.oomScoreAdj });
  }
  const file = opts.writeFile === undefined ? undefined : openSync(opts.writeFile, 'w');
  try {
    const child = spawn('crun', args, {
      stdio: [
        opts.stdin ? 'pipe' : nullStdio(), // not the host's /dev/null (private-null.ts)
        'pipe',
        'pipe',
        ...(opts.fd3 ? ['pipe' as const] : []),
        ...(file === undefined ? [] : [file]),
      ],
    });
    // Without the helper the score can only follow the spawn: crun exec may have started the
    // command at the edge's own score by then (a degraded mode, warned about at edge start).
    try {
      if (child.pid) writeFileSync(`/proc/${child.pid}/oom_score_adj`, String(opts.oomScoreAdj));
    } catch {
      // exited already
    }
    return child;
  } finally {
    if (file !== undefined) closeSync(file);
  }
}
