import type { EdgeSessionCarry } from '../../../protocol/schemas.js';
import type { OpenSessionRequest } from '@dsec/sdk/schema';
import { isRegularFileInRoot } from '../sandbox-files.js';
import { sandboxOomKills } from '../../../../host/cgroups.js';
import { LANDLOCK_PATH } from '../oci-config.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { killTagged, SandboxProcess } from './sandbox-process.js';
import { ShellSession, type SessionHost, type SessionShellStart, type SessionStandbyShell } from '../../shared/shell-session.js';

/**
 * A container's session commands: each a shell started in the sandbox (processSpecFor: its own
 * Landlock domain), by dsec-spawn or `crun exec`. `standbyAllowed`: whether a shell may be
 * started ahead now (not while the sandbox is paused or held for a move).
 */
function containerSessionHost(target: ExecTarget, standbyAllowed: () => boolean): SessionHost {
  const spawn = (argv: string[], o: Omit<SessionShellStart, 'input' | 'timeoutMs'>, start: { input?: Buffer; timeoutMs?: number }) => {
    const spec = processSpecFor(target, argv, { cwd: o.cwd, env: o.env, writablePaths: o.writablePaths });
    if (o.clearEnv) spec.env = [];
    const standby = start.input === undefined;
    // A shell waits between commands only in a Landlock domain of its own: in it, nothing an
    // earlier command left running can open its stdin through /proc or trace it meanwhile.
    if (standby && spec.args[0] !== LANDLOCK_PATH) return undefined;
    return new SandboxProcess(target, spec, {
      input: start.input,
      maxOutputBytes: 0,
      timeoutMs: start.timeoutMs,
      tag: o.tag,
      fd3MaxBytes: o.fd3MaxBytes,
      standby: standby ? 'input' : undefined,
    });
  };
  return {
    startShell: (argv, o) => spawn(argv, o, { input: o.input, timeoutMs: o.timeoutMs })!,
    standby: (argv, o): SessionStandbyShell | undefined => (standbyAllowed() ? spawn(argv, o, {}) : undefined),
    // The OOM counter alone (before and after every command), not the sandbox's whole usage.
    oomKills: () => sandboxOomKills(target.id),
    endTagged: (tag) => void killTagged(target.id, tag),
  };
}

/** A session in a container; a bad cwd, env or writablePaths fails here, at open. */
export function openContainerSession(
  target: ExecTarget,
  req: OpenSessionRequest,
  standbyAllowed: () => boolean,
  carried?: EdgeSessionCarry,
): ShellSession {
  const s = new ShellSession(containerSessionHost(target, standbyAllowed), req, isRegularFileInRoot(target.rootfs, '/bin/bash'), carried);
  processSpecFor(target, [s.shell], { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths });
  return s;
}
