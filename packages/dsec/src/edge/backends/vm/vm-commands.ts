import {
  DEFAULT_EXEC_TIMEOUT_MS,
  DEFAULT_MAX_OUTPUT_BYTES,
  type Encoding,
  type ExecRequest,
  type ExecResult,
  type OpenSessionRequest,
  type ProcessInfo,
  type ProcessOutput,
  type SessionExecRequest,
  type SessionInfo,
  type StartProcessRequest,
} from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import type { TerminalChannel, TerminalRequest } from '../../protocol/edge-api.js';
import type { ExecEvent } from '../../protocol/exec-event.js';
import { rejectNul } from '../../protocol/reject-nul.js';
import type { ProcessExit } from '../shared/command-process.js';
import { iterateOutput } from '../shared/output-stream.js';
import { sandboxPath } from '../shared/sandbox-path.js';
import { ShellSession } from '../shared/shell-session.js';
import { mergeEnv, parseUser } from '../shared/user-env.js';
import type { GuestStat } from './vm-files.js';
import { VmProcess, type GuestCommand } from './vm-process.js';
import type { LiveVm } from './vm-record.js';
import { checkWritablePaths, vmSessionHost } from './vm-session.js';
import { openVmTerminal } from './vm-terminal.js';

/** How the VM backend's calls find a VM: `running` refuses a paused one or one whose agent is gone. */
export interface VmLookup {
  running(id: string): LiveVm;
  vm(id: string): LiveVm;
}

/**
 * What runs in a VM from outside, through its guest agent: one-shot and streamed commands,
 * background processes, shell sessions and terminals.
 */
export class VmCommands {
  readonly #ctx: VmLookup;

  constructor(ctx: VmLookup) {
    this.#ctx = ctx;
  }

  // --- commands ------------------------------------------------------------------------------

  /**
   * argv, env, cwd and user of a command in the guest, as for a container's. With writablePaths
   * the agent confines it with the guest kernel's Landlock (`rw`; checkWritablePaths first).
   */
  #command(
    v: LiveVm,
    cmd: string | string[],
    opts: { cwd?: string | undefined; env?: Record<string, string> | undefined; writablePaths?: string[] | undefined },
  ): GuestCommand {
    rejectNul('cmd', typeof cmd === 'string' ? [cmd] : cmd);
    rejectNul('env', Object.entries(opts.env ?? {}).flat());
    if (opts.cwd !== undefined) rejectNul('cwd', [opts.cwd]);
    const user = parseUser(v.record.config.user);
    return {
      argv: typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd,
      env: mergeEnv(v.record.config.env, v.record.env, opts.env ?? {}),
      cwd: opts.cwd ?? v.record.config.cwd,
      uid: user.uid,
      gid: user.gid,
      ...(opts.writablePaths ? { rw: opts.writablePaths } : {}),
    };
  }

  #start(id: string, req: ExecRequest, signal?: AbortSignal): VmProcess {
    const v = this.#ctx.running(id);
    const proc = new VmProcess(v.agent, this.#command(v, req.cmd, req), {
      input: req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8'),
      maxOutputBytes: req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
      timeoutMs: req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
    });
    if (signal?.aborted) proc.kill();
    else signal?.addEventListener('abort', () => proc.kill(), { once: true });
    return proc;
  }

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    await checkWritablePaths(this.#ctx.running(id).agent, req.writablePaths);
    const proc = this.#start(id, req, signal);
    const exit = await proc.done;
    const status = exitStatus(proc, exit, req);
    return { ...status, stdout: proc.stdout.encode(status.encoding), stderr: proc.stderr.encode(status.encoding) };
  }

  async *execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
    await checkWritablePaths(this.#ctx.running(id).agent, req.writablePaths);
    const proc = this.#start(id, req, signal);
    // uncapped: every byte streams (the cap bounds only what is kept), as for a container.
    for await (const { stream, data } of iterateOutput(proc, req.uncapped ? 'raw' : 'kept')) yield { type: stream, data };
    const exit = await proc.done;
    const status = exitStatus(proc, exit, req);
    yield { type: 'exit', result: req.uncapped ? { ...status, truncated: false } : status };
  }

  // --- background processes ------------------------------------------------------------------

  async startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    const v = this.#ctx.running(id);
    await checkWritablePaths(v.agent, req.writablePaths);
    const maxOutputBytes = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const reservation = v.processes.reserveOutput(maxOutputBytes); // before it starts: a refusal runs nothing
    let proc: VmProcess;
    try {
      proc = new VmProcess(v.agent, this.#command(v, req.cmd, req), {
        stdin: req.stdin ?? false,
        maxOutputBytes,
        timeoutMs: req.timeoutMs,
      });
    } catch (err) {
      reservation.release();
      throw err;
    }
    return v.processes.add(req.cmd, proc, undefined, reservation);
  }

  async listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#ctx.vm(id).processes.list();
  }

  async processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#ctx.vm(id).processes.output(pid, offsets, encoding);
  }

  async waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#ctx.vm(id).processes.wait(pid, timeoutMs);
  }

  async signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const { proc } = this.#ctx.vm(id).processes.entry(pid);
    this.#ctx.running(id);
    await proc.signal(signal);
    if (signal === 'SIGKILL') await proc.done;
    return this.#ctx.vm(id).processes.info(pid);
  }

  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    const { proc } = this.#ctx.vm(id).processes.entry(pid);
    this.#ctx.running(id);
    if (proc.exit) throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has exited`, { pid });
    if (data.length && !proc.writeStdin(data)) {
      throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has no open stdin (start it with stdin: true)`, { pid });
    }
    if (eof) proc.endStdin();
  }

  // --- sessions ------------------------------------------------------------------------------

  /**
   * A shell session in the guest with the container's semantics (exec/shell-session.ts): one
   * shell per command, its state carried on fd 3, each in a Landlock domain of its own, all of
   * the session's commands in one guest cgroup (vm-session.ts). A bad cwd or writablePaths is a
   * 400 here, at open.
   */
  async openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const v = this.#ctx.running(id);
    v.sessions.checkRoom();
    this.#command(v, ['/bin/sh'], req); // NULs in env or cwd
    if (req.cwd !== undefined) {
      const cwd = await v.agent.call('stat', { path: sandboxPath(req.cwd, v.record.config.cwd) }).then(
        (r) => (JSON.parse(r.payload.toString('utf8')) as GuestStat).type,
        () => undefined,
      );
      if (cwd !== 'dir' && cwd !== 'symlink') {
        throw new ApiError(
          'INVALID_REQUEST',
          `cwd ${req.cwd} ${cwd ? 'is not a directory' : 'does not exist'} in the sandbox; create it first (files.mkdir) or use another`,
          { field: 'cwd', path: req.cwd },
        );
      }
    }
    await checkWritablePaths(v.agent, req.writablePaths);
    const hasBash =
      req.shell === 'sh'
        ? false
        : await v.agent.call('stat', { path: '/bin/bash' }).then(
            () => true,
            () => false,
          );
    const host = vmSessionHost(v.agent, (argv, cwd, env) => this.#command(v, argv, { cwd, env }));
    return v.sessions.add(new ShellSession(host, req, hasBash));
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    return this.#ctx.vm(id).sessions.list();
  }

  async sessionExec(
    id: string,
    sid: string,
    req: SessionExecRequest,
    signal?: AbortSignal,
  ): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#ctx.running(id).sessions.exec(sid, req, signal);
  }

  async closeSession(id: string, sid: string): Promise<void> {
    await this.#ctx.running(id).sessions.close(sid);
  }

  /** An interactive command under a terminal in the guest (default: bash, else sh). */
  async openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    const v = this.#ctx.running(id);
    let argv = req.cmd?.length ? req.cmd : undefined;
    if (!argv) {
      const bash = await v.agent.call('stat', { path: '/bin/bash' }).then(
        () => true,
        () => false,
      );
      argv = [bash ? '/bin/bash' : '/bin/sh'];
    }
    const cmd = this.#command(v, argv, { cwd: req.cwd, env: { TERM: 'xterm-256color', ...req.env } });
    try {
      const t = await openVmTerminal(v.agent, cmd, { cols: req.cols, rows: req.rows });
      v.terminals.add(t);
      void t.exit.then(() => v.terminals.delete(t));
      return t;
    } catch (err) {
      throw new ApiError('INVALID_REQUEST', `could not start the terminal: ${(err as Error).message}`, { cmd: argv });
    }
  }
}

function exitStatus(proc: VmProcess, exit: ProcessExit, req: ExecRequest): Omit<ExecResult, 'stdout' | 'stderr'> {
  return {
    exitCode: exit.exitCode,
    encoding: req.encoding ?? 'utf8',
    truncated: proc.stdout.truncated || proc.stderr.truncated,
    stdoutBytes: proc.stdout.total,
    stderrBytes: proc.stderr.total,
    timedOut: exit.timedOut,
    oomKilled: false,
    durationMs: exit.durationMs,
  };
}
