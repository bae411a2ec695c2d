import { ApiError } from '../../../api-error.js';
import type { SessionHost } from '../shared/shell-session.js';
import type { AgentClient } from './agent-client.js';
import { VmProcess, type GuestCommand } from './vm-process.js';

/**
 * A VM's session commands (exec/shell-session.ts): each is a shell the guest agent starts with
 * its state pipe on fd 3, in a Landlock domain of its own (the guest kernel's: `isolate`, or `rw`
 * for writablePaths), and in a cgroup in the guest that every command of the session shares, so
 * closing the session ends what its commands left running (also jobs that called setsid). The
 * exit status is the agent's waitpid of the shell, the output what came through its own pipes.
 */
export function vmSessionHost(
  agent: AgentClient,
  command: (argv: string[], cwd: string | undefined, env: Record<string, string> | undefined) => GuestCommand,
): SessionHost {
  return {
    startShell(argv, o) {
      const cmd = command(argv, o.cwd, o.env);
      if (o.clearEnv) cmd.env = [];
      const confined: GuestCommand = { ...cmd, group: o.tag, ...(o.writablePaths ? { rw: o.writablePaths } : { isolate: true }) };
      return new VmProcess(agent, confined, { input: o.input, maxOutputBytes: 0, timeoutMs: o.timeoutMs, fd3MaxBytes: o.fd3MaxBytes });
    },
    oomKills: () => guestOomKills(agent),
    async endTagged(tag) {
      // ENOENT: no command of the session ever ran; a closed channel: the VM is going anyway.
      await agent.call('kill_group', { group: tag }).catch(() => undefined);
    },
  };
}

/** The guest kernel's count of OOM kills (/proc/vmstat oom_kill): the guest's own OOM killer ends processes, not the host's. */
export async function guestOomKills(agent: AgentClient): Promise<number> {
  const r = await agent.call('read', { path: '/proc/vmstat', max: 1 << 16 }).catch(() => undefined);
  const m = r && /^oom_kill (\d+)$/m.exec(Buffer.concat(r.data).toString('utf8'));
  return m ? Number(m[1]) : 0;
}

/**
 * Checks that each of a command's writablePaths exists in the guest (as a container's do), so a
 * typo is a 400 naming the path rather than the command failing closed with exit 126.
 */
export async function checkWritablePaths(agent: AgentClient, paths: string[] | undefined): Promise<void> {
  for (const p of paths ?? []) {
    const found = await agent.call('stat', { path: p }).then(
      () => true,
      () => false,
    );
    if (!found) throw new ApiError('INVALID_REQUEST', `writablePaths: ${p} does not exist in the sandbox; create it first`, { path: p });
  }
}
