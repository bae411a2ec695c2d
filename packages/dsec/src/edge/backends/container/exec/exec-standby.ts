import { ISOLATE_COMMANDS, type ExecTarget } from './exec-target.js';
import { LANDLOCK_PATH, type ProcessSpec } from '../oci-config.js';
import { SandboxProcess } from './sandbox-process.js';
import { SPAWN_MAX_REQUEST, spawnFieldsBytes } from '../../../../host/spawn-helper.js';

/** How long a sandbox that runs no command keeps its exec standby: an idle sandbox holds no process of the edge's. */
export const EXEC_STANDBY_IDLE_MS = 30_000;

interface Standby {
  proc: SandboxProcess;
  idle: NodeJS.Timeout;
}

/**
 * One exec's process made ahead per sandbox while it runs commands (a trainer's rollout: dozens to
 * hundreds of execs, one after another), by dsec-spawn as far as its exec (native/enter-core.c
 * `--standby`): entered into the sandbox's namespaces, in its own command cgroup, the sandbox's
 * user, capabilities, no_new_privs, a Landlock domain of its own and the sandbox's seccomp filter.
 * The next exec sends it only its cwd, argv and environment, and is spared the fork, the setns and
 * the set-up: most of an exec's time on the edge. It is a fresh process all the same, made after
 * the previous command began, non-dumpable until its exec, so nothing in the sandbox can reach it.
 *
 * Only for the commands it fits: the default domain (`--isolate`: no writablePaths) and the user it
 * was set up as; others start as before. Made after a command, never while the sandbox is paused
 * or held for a move (`allowed`), and let go after EXEC_STANDBY_IDLE_MS without one. A move does
 * not count it among the sandbox's processes (container-quiesce.ts): it goes with the source.
 */
const standbys = new Map<string, Standby>();

/** The argv of `spec` when the standby can run it: processSpecFor's `--isolate` domain and nothing else. */
function isolatedArgs(spec: ProcessSpec): string[] | undefined {
  const [landlock, flag, end, ...args] = spec.args;
  return landlock === LANDLOCK_PATH && flag === '--isolate' && end === '--' && args.length > 0 ? args : undefined;
}

/**
 * The sandbox's standby started as `spec`'s command, when there is one that fits and still waits;
 * else undefined (the caller starts the command itself). A standby that does not fit is let go.
 */
export function takeExecStandby(
  target: ExecTarget,
  spec: ProcessSpec,
  opts: { input?: Buffer | undefined; maxOutputBytes: number; timeoutMs?: number | undefined },
): SandboxProcess | undefined {
  const s = standbys.get(target.id);
  if (!s) return undefined;
  standbys.delete(target.id);
  clearTimeout(s.idle);
  const args = isolatedArgs(spec);
  if (!args || !s.proc.standing || !s.proc.fits(spec) || spawnFieldsBytes(args) + spawnFieldsBytes(spec.env) > SPAWN_MAX_REQUEST) {
    s.proc.retire();
    return undefined;
  }
  s.proc.beginCommand(spec, args, opts);
  return s.proc;
}

/** Makes the sandbox's next exec's process ahead, where it can: dsec-spawn starts its commands, each in a domain of its own. */
export function prepareExecStandby(target: ExecTarget, spec: ProcessSpec, allowed: boolean): void {
  if (!allowed || standbys.has(target.id) || !ISOLATE_COMMANDS || !target.enter || !target.crun.spawner || !isolatedArgs(spec)) return;
  let proc: SandboxProcess;
  try {
    proc = new SandboxProcess(target, { ...spec, cwd: '/', env: [] }, { maxOutputBytes: 0, standby: 'command' });
  } catch {
    return; // the sandbox is going: the next command starts its own
  }
  const idle = setTimeout(() => dropExecStandby(target.id), EXEC_STANDBY_IDLE_MS);
  idle.unref();
  standbys.set(target.id, { proc, idle });
}

/**
 * Lets the sandbox's standby go (idle, the sandbox's teardown, the edge's stop). Not waited for:
 * in a paused sandbox it goes at the thaw (a frozen task dies only then).
 */
export function dropExecStandby(sandboxId: string): void {
  const s = standbys.get(sandboxId);
  if (!s) return;
  standbys.delete(sandboxId);
  clearTimeout(s.idle);
  s.proc.retire();
}

/** The host pid of the sandbox's standby, if one waits: the edge's, not the sandbox's work (a move does not count it). */
export function execStandbyPid(sandboxId: string): number | undefined {
  const s = standbys.get(sandboxId);
  return s?.proc.standing ? s.proc.hostPid : undefined;
}

/**
 * Whether the sandbox's standby is on its way and its pid not yet known: dsec-spawn reports its
 * starter's pid a moment after the fork, and by then the standby may already be in the sandbox's
 * pid namespace. A move's look at the sandbox's processes waits for this to pass, or it would
 * count (and, with `restartProcesses`, end) the edge's own process as the sandbox's.
 */
export function execStandbyStarting(sandboxId: string): boolean {
  const s = standbys.get(sandboxId);
  return s !== undefined && s.proc.standing && s.proc.hostPid === undefined;
}

/** Whether the sandbox has an exec standby waiting now (tests, and what the edge reports of itself). */
export function execStandbyWaiting(sandboxId: string): boolean {
  return standbys.get(sandboxId)?.proc.standing === true;
}
