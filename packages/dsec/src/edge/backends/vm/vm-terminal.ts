import { randomBytes } from 'node:crypto';
import type { TerminalChannel } from '../../protocol/edge-api.js';
import type { AgentClient } from './agent-client.js';
import type { AgentFrame } from './agent-frames.js';
import type { GuestCommand } from './vm-process.js';

/**
 * An interactive command under a pseudo-terminal inside a VM guest: the agent opens the pty in
 * the guest's devpts and streams the master side's bytes; keystrokes and resizes go back by id.
 * The command runs in a guest cgroup of its own, so kill() ends what it started too (an
 * interactive shell puts each job in a process group of its own). A command that cannot start
 * (no such program) gives a terminal that prints why and exits 127 (126: not executable), as a
 * container's does.
 */
export function openVmTerminal(agent: AgentClient, cmd: GuestCommand, size: { cols: number; rows: number }): Promise<TerminalChannel> {
  const group = `t-${randomBytes(6).toString('hex')}`;
  return new Promise((resolve, reject) => {
    const listeners = new Set<(data: Buffer) => void>();
    const early: Buffer[] = [];
    let started = false;
    let resolveExit!: (code: number) => void;
    const exit = new Promise<number>((r) => (resolveExit = r));
    let done = false;
    const finish = (code: number): void => {
      if (done) return;
      done = true;
      agent.release(id);
      resolveExit(code);
    };
    const onEvent = (f: AgentFrame): void => {
      const ev = f.header['ev'];
      if (ev === 'started') {
        started = true;
        resolve(channel);
      } else if (ev === 'stdout' || ev === 'stderr') {
        if (listeners.size) for (const l of listeners) l(f.payload);
        else early.push(f.payload);
      } else if (ev === 'exit') finish(Number(f.header['code'] ?? 1));
      else if (ev === 'error' && !started && f.header['code'] !== 'EAGAIN') {
        started = true;
        early.push(Buffer.from(`${String(f.header['message'] ?? 'cannot start the command')}\r\n`));
        resolve(channel);
        finish(f.header['code'] === 'ENOENT' ? 127 : 126);
      } else if (ev === 'error' || ev === 'closed') {
        const msg = String(f.header['message'] ?? 'the guest agent could not start the terminal');
        if (!started) reject(new Error(msg));
        finish(126);
      }
    };
    const id = agent.send(
      'exec',
      {
        argv: cmd.argv,
        env: cmd.env,
        cwd: cmd.cwd,
        uid: cmd.uid,
        gid: cmd.gid,
        stdin: true,
        pty: true,
        cols: size.cols,
        rows: size.rows,
        group,
      },
      undefined,
      onEvent,
    );
    const channel: TerminalChannel = {
      exit,
      onData(listener) {
        listeners.add(listener);
        for (const b of early.splice(0)) listener(b);
      },
      write(data) {
        if (!done) agent.write({ op: 'stdin', id }, Buffer.isBuffer(data) ? data : Buffer.from(data, 'utf8'));
      },
      resize(cols, rows) {
        if (!done) agent.write({ op: 'resize', id, cols, rows });
      },
      kill() {
        if (done) return;
        agent.write({ op: 'signal', id, signal: 9 });
        void agent.call('kill_group', { group }).catch(() => undefined); // gone already, or the VM with it
      },
    };
  });
}
