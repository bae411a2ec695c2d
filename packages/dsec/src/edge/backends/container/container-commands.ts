import type {
  Encoding,
  ExecRequest,
  ExecResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
} from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import type { TerminalChannel, TerminalRequest } from '../../protocol/edge-api.js';
import type { ExecEvent } from '../../protocol/exec-event.js';
import { openContainerSession } from './exec/container-session.js';
import { PtyProcess, type PtyOptions } from './exec/pty-process.js';
import { runCommand, streamCommand } from './exec/run-command.js';
import { startProcess } from './exec/start-process.js';
import { standbyAllowed, type LiveSandbox } from './live-sandbox.js';
import { isRegularFileInRoot } from './sandbox-files.js';

/**
 * What runs in a container sandbox from outside (exec/): one-shot and streamed commands,
 * background processes, shell sessions and terminals, each kept in the sandbox's tables so a
 * kill ends them and a restarted edge reports them.
 */
export class ContainerCommands {
  readonly #running: (id: string) => LiveSandbox;

  /** `running`: the running sandbox of an id, or the error that says why there is none. */
  constructor(running: (id: string) => LiveSandbox) {
    this.#running = running;
  }

  // --- commands ------------------------------------------------------------------------------

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    const l = this.#running(id);
    return runCommand(l.target, req, signal, standbyAllowed(l));
  }

  execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    const l = this.#running(id);
    return streamCommand(l.target, req, signal, standbyAllowed(l));
  }

  // --- background processes ------------------------------------------------------------------

  async startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    const l = this.#running(id);
    return startProcess(l.processes, l.target, req);
  }

  async listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#running(id).processes.list();
  }

  async processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#running(id).processes.output(pid, offsets, encoding);
  }

  async waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#running(id).processes.wait(pid, timeoutMs);
  }

  async signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const { proc } = this.#running(id).processes.entry(pid);
    await proc.signal(signal);
    if (signal === 'SIGKILL') await proc.done;
    return this.#running(id).processes.info(pid);
  }

  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    const { proc } = this.#running(id).processes.entry(pid);
    if (proc.exit) throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has exited`, { pid });
    if (data.length && !proc.writeStdin(data)) {
      throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has no open stdin (start it with stdin: true)`, { pid });
    }
    if (eof) proc.endStdin();
  }

  // --- sessions ------------------------------------------------------------------------------

  async openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const l = this.#running(id);
    l.sessions.checkRoom();
    return l.sessions.add(openContainerSession(l.target, req, standbyAllowed(l)));
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    return this.#running(id).sessions.list();
  }

  async sessionExec(
    id: string,
    sid: string,
    req: SessionExecRequest,
    signal?: AbortSignal,
  ): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#running(id).sessions.exec(sid, req, signal);
  }

  async closeSession(id: string, sid: string): Promise<void> {
    await this.#running(id).sessions.close(sid);
  }

  // --- terminals ---------------------------------------------------------------------------

  async openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    const l = this.#running(id);
    const cmd = req.cmd?.length ? req.cmd : [isRegularFileInRoot(l.target.rootfs, '/bin/bash') ? '/bin/bash' : '/bin/sh'];
    const opts: PtyOptions = { cmd, cols: req.cols, rows: req.rows };
    if (req.cwd !== undefined) opts.cwd = req.cwd;
    if (req.env !== undefined) opts.env = req.env;
    const p = new PtyProcess(l.target, opts);
    l.ptys.add(p);
    void p.exit.then(() => l.ptys.delete(p));
    return {
      exit: p.exit,
      onData: (listener) => p.onData((s) => listener(Buffer.from(s, 'utf8'))),
      write: (data) => p.write(data),
      resize: (cols, rows) => p.resize(cols, rows),
      kill: () => p.kill(),
    };
  }
}
