import type { EdgeSessionCarry } from '../../../protocol/schemas.js';
import type { OpenSessionRequest } from '@dsec/sdk/schema';
import { isRegularFileInRoot } from '../sandbox-files.js';
import { sandboxOomKills } from '../../../../host/cgroups.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { killTagged, SandboxProcess } from './sandbox-process.js';
import { ShellSession, type SessionHost } from '../../shared/shell-session.js';

/** A container's session commands: each a `crun exec` of the shell (processSpecFor: its own Landlock domain). */
function containerSessionHost(target: ExecTarget): SessionHost {
  return {
    startShell(argv, o) {
      const spec = processSpecFor(target, argv, { cwd: o.cwd, env: o.env, writablePaths: o.writablePaths });
      if (o.clearEnv) spec.env = [];
      return new SandboxProcess(target, spec, {
        input: o.input,
        maxOutputBytes: 0,
        timeoutMs: o.timeoutMs,
        tag: o.tag,
        fd3MaxBytes: o.fd3MaxBytes,
      });
    },
    // The OOM counter alone (before and after every command), not the sandbox's whole usage.
    oomKills: () => sandboxOomKills(target.id),
    endTagged: (tag) => void killTagged(target.id, tag),
  };
}

/** A session in a container; a bad cwd, env or writablePaths fails here, at open. */
export function openContainerSession(target: ExecTarget, req: OpenSessionRequest, carried?: EdgeSessionCarry): ShellSession {
  const s = new ShellSession(containerSessionHost(target), req, isRegularFileInRoot(target.rootfs, '/bin/bash'), carried);
  processSpecFor(target, [s.shell], { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths });
  return s;
}
