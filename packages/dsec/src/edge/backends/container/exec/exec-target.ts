import type { ImageConfig } from '@dsec/sdk/schema';
import type { Crun } from '../crun.js';
import { LANDLOCK_PATH, type ProcessSpec } from '../oci-config.js';
import { mergeEnv, parseUser } from '../../shared/user-env.js';
import { rejectNul } from '../../../protocol/reject-nul.js';
import { ApiError } from '../../../../api-error.js';
import { statInRoot } from '../sandbox-files.js';
import { landlockAbi } from '../../../../host/syscalls.js';
import type { EnterTarget } from './enter-child.js';

/** What the exec engine needs to know of a sandbox to start processes in it from outside. */
export interface ExecTarget {
  crun: Crun;
  id: string;
  /** Edge-side scratch directory (never inside the sandbox) for process specs and pid files. */
  scratchDir: string;
  /** The sandbox's root as the host sees it (for checks such as "is there a /bin/bash"). */
  rootfs: string;
  config: ImageConfig;
  env: Record<string, string>;
  /**
   * How commands start without `crun exec` (dsec-spawn's enter request, enter-child.ts); absent where they cannot
   * (no dsec-spawn, or a sandbox whose seccomp filter crun compiled itself).
   */
  enter?: EnterTarget | undefined;
  /**
   * Why no command can start in this sandbox, when none can: an adopted sandbox whose
   * dsec-landlock is an older build's and could not be replaced (edge/helper-binds.ts).
   */
  unusable?: string;
}

/**
 * Whether every command starts in a Landlock domain of its own (`dsec-landlock --isolate`), so
 * that nothing an earlier command left running can reach into it (see landlock-domain.c). Needs
 * Landlock ABI 2 (REFER, so that links and renames across directories keep working); without
 * it commands start as they are.
 */
export const ISOLATE_COMMANDS = landlockAbi() >= 2;

/**
 * argv, env and cwd for a command: image env < sandbox env < command env. The argv starts with
 * dsec-landlock and its flags: a Landlock domain of the command's own (all it starts in it too)
 * and, with `writablePaths`, changes to files only beneath those paths. crun exec runs the binary,
 * which applies the domain and execs the command; the edge's own starter reads the flags and
 * applies the same domain in the command's process (enter-child.ts splitLandlock). Either way
 * nothing of dsec stays in the sandbox.
 */
export function processSpecFor(
  target: ExecTarget,
  cmd: string | string[],
  opts: { cwd?: string | undefined; env?: Record<string, string> | undefined; writablePaths?: string[] | undefined } = {},
): ProcessSpec {
  if (target.unusable) throw new ApiError('SANDBOX_NOT_RUNNING', target.unusable, { id: target.id });
  rejectNul('cmd', typeof cmd === 'string' ? [cmd] : cmd);
  rejectNul('env', Object.entries(opts.env ?? {}).flat());
  if (opts.cwd !== undefined) rejectNul('cwd', [opts.cwd]);
  const args = typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd;
  if (opts.cwd !== undefined) checkCwd(target, opts.cwd);
  return {
    args: opts.writablePaths
      ? landlocked(target, opts.writablePaths, args)
      : ISOLATE_COMMANDS
        ? [LANDLOCK_PATH, '--isolate', '--', ...args]
        : args,
    env: mergeEnv(target.config.env, target.env, opts.env ?? {}),
    cwd: opts.cwd ?? target.config.cwd,
    user: parseUser(target.config.user),
  };
}

/**
 * A cwd that is not a directory in the sandbox is the caller's mistake: say so as a 400 rather
 * than let crun fail the command with exit 255 and its chdir error mixed into the command's stderr.
 */
function checkCwd(target: ExecTarget, cwd: string): void {
  if (/^[/.]*$/.test(cwd)) return; // the root (`/`, `/.`): always there
  let type: string;
  try {
    type = statInRoot(target.rootfs, cwd).type;
  } catch (err) {
    if (err instanceof ApiError && (err.code === 'FILE_NOT_FOUND' || err.code === 'PATH_CONFLICT')) {
      throw new ApiError('INVALID_REQUEST', `cwd ${cwd} does not exist in the sandbox; create it first (files.mkdir) or use another`, {
        field: 'cwd',
        path: cwd,
      });
    }
    throw err;
  }
  // A symlink is followed by the chdir; one that leads nowhere fails there.
  if (type !== 'dir' && type !== 'symlink')
    throw new ApiError('INVALID_REQUEST', `cwd ${cwd} is not a directory in the sandbox`, { field: 'cwd', path: cwd });
}

function landlocked(target: ExecTarget, writable: string[], args: string[]): string[] {
  const rw: string[] = [];
  for (const p of writable) {
    try {
      statInRoot(target.rootfs, p);
    } catch {
      throw new ApiError('INVALID_REQUEST', `writablePaths: ${p} does not exist in the sandbox; create it first`, { path: p });
    }
    rw.push('--rw', p);
  }
  return [LANDLOCK_PATH, ...rw, '--', ...args];
}
