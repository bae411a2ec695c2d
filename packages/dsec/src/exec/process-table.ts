import { randomBytes } from 'node:crypto';
import type { Encoding, ProcessInfo, ProcessOutput, StartProcessRequest } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { SandboxProcess, type CommandProcess } from './sandbox-process.js';

interface Entry {
  id: string;
  cmd: StartProcessRequest['cmd'];
  proc: CommandProcess;
}

/** How many finished processes a sandbox remembers (running ones are never dropped). */
const KEEP_EXITED = 64;

/**
 * Background processes of one sandbox: started detached from any HTTP request (a web server, a
 * watcher), listed, polled for output, waited on, signalled. They live as long as the sandbox
 * or until they exit.
 */
export class ProcessTable {
  readonly #entries = new Map<string, Entry>();

  /** `sandboxId` names the sandbox in PROCESS_NOT_FOUND errors. */
  constructor(readonly sandboxId: string) {}

  start(target: ExecTarget, req: StartProcessRequest): ProcessInfo {
    const proc = new SandboxProcess(target, processSpecFor(target, req.cmd, { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths }), {
      stdin: req.stdin ?? false,
      maxOutputBytes: req.maxOutputBytes ?? 1 << 20,
      timeoutMs: req.timeoutMs,
    });
    return this.add(req.cmd, proc);
  }

  /** Tracks a command some other way started (a VM guest's agent runs it). */
  add(cmd: StartProcessRequest['cmd'], proc: CommandProcess): ProcessInfo {
    const entry: Entry = { id: `p-${randomBytes(6).toString('hex')}`, cmd, proc };
    this.#entries.set(entry.id, entry);
    void proc.done.then(() => this.#prune());
    return this.#info(entry);
  }

  get(id: string): Entry | undefined {
    return this.#entries.get(id);
  }

  /** The process, or PROCESS_NOT_FOUND: every backend's calls on one process start here. */
  entry(id: string): Entry {
    const e = this.#entries.get(id);
    if (!e) throw new ApiError('PROCESS_NOT_FOUND', `no process ${id} in sandbox ${this.sandboxId}`, { pid: id });
    return e;
  }

  list(): ProcessInfo[] {
    return [...this.#entries.values()].map((e) => this.#info(e));
  }

  info(id: string): ProcessInfo {
    return this.#info(this.entry(id));
  }

  output(id: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): ProcessOutput {
    const e = this.entry(id);
    return {
      process: this.#info(e),
      stdout: e.proc.stdout.since(offsets.stdout).toString(encoding),
      stderr: e.proc.stderr.since(offsets.stderr).toString(encoding),
      encoding,
    };
  }

  async wait(id: string, timeoutMs: number): Promise<ProcessInfo> {
    const e = this.entry(id);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([e.proc.done, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    return this.#info(e);
  }

  /** Kills everything still running (the sandbox is going away). */
  killAll(): void {
    for (const e of this.#entries.values()) e.proc.kill({ now: true });
  }

  #info(e: Entry): ProcessInfo {
    const exit = e.proc.exit;
    const info: ProcessInfo = {
      id: e.id,
      cmd: e.cmd,
      status: exit ? 'exited' : 'running',
      timedOut: exit?.timedOut ?? false,
      startedAt: e.proc.startedAt.toISOString(),
      stdoutBytes: e.proc.stdout.total,
      stderrBytes: e.proc.stderr.total,
      truncated: e.proc.stdout.truncated || e.proc.stderr.truncated,
    };
    if (exit) {
      info.exitCode = exit.exitCode;
      info.durationMs = exit.durationMs;
    }
    return info;
  }

  #prune(): void {
    const exited = [...this.#entries.values()].filter((e) => e.proc.exit);
    for (const e of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) this.#entries.delete(e.id);
  }
}
