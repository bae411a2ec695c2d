import { randomBytes } from 'node:crypto';
import type { ExecResult, OpenSessionRequest, SessionExecRequest, SessionInfo } from '@dsec/sdk/schema';
import { killTree, processTree } from '../edge/process-tree.js';
import { isRegularFileInRoot } from '../edge/sandbox-files.js';
import { sandboxUsage } from '../host/cgroups.js';
import { CappedOutput } from './capped-output.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { SandboxProcess, type StreamName } from './sandbox-process.js';

/** Single-quotes a string for a POSIX shell. */
export function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Splits one stream of a session shell into per-command output: everything up to the command's
 * end marker (a line with a random nonce, written by the shell after the command) is the
 * command's output, capped; the marker line carries the exit status on stdout.
 */
class MarkerScanner {
  #pending: Buffer = Buffer.alloc(0);
  readonly output: CappedOutput;
  found: string | undefined;

  constructor(
    private readonly marker: Buffer,
    cap: number,
  ) {
    this.output = new CappedOutput(cap);
  }

  push(chunk: Buffer): void {
    if (this.found !== undefined) return;
    this.#pending = this.#pending.length ? Buffer.concat([this.#pending, chunk]) : chunk;
    const at = this.#pending.indexOf(this.marker);
    if (at >= 0) {
      const eol = this.#pending.indexOf(0x0a, at + this.marker.length);
      if (eol < 0) return; // the rest of the marker line is still coming
      this.output.push(this.#pending.subarray(0, at));
      this.found = this.#pending.subarray(at + this.marker.length, eol).toString('utf8').trim();
      this.#pending = Buffer.alloc(0);
      return;
    }
    // Keep a tail long enough to hold a marker split across chunks; the rest is output.
    const keep = this.marker.length + 16;
    if (this.#pending.length > keep) {
      this.output.push(this.#pending.subarray(0, this.#pending.length - keep));
      this.#pending = Buffer.from(this.#pending.subarray(this.#pending.length - keep));
    }
  }
}

/**
 * A persistent shell in a sandbox: one `crun exec` of bash (or sh) whose cwd, environment and
 * variables persist across commands. Each command is sent on the shell's stdin as
 * `eval '<cmd>' </dev/null` followed by end markers, so it gets its own output and exit code,
 * cannot read the commands that follow, and no command starts a new crun process.
 * A timeout kills the command's processes (the shell's descendants), not the shell.
 */
export class ShellSession {
  readonly id: string;
  readonly shell: string;
  readonly createdAt = new Date();
  commands = 0;
  #busy = false;
  #queue: Promise<unknown> = Promise.resolve();
  readonly #proc: SandboxProcess;
  #current: { stdout: MarkerScanner; stderr: MarkerScanner; wake: () => void } | undefined;

  readonly #sandboxId: string;

  constructor(target: ExecTarget, req: OpenSessionRequest) {
    this.#sandboxId = target.id;
    this.id = `ss-${randomBytes(6).toString('hex')}`;
    const wantBash = req.shell === 'bash' || ((req.shell ?? 'auto') === 'auto' && isRegularFileInRoot(target.rootfs, '/bin/bash'));
    this.shell = wantBash ? '/bin/bash' : '/bin/sh';
    const args = wantBash ? ['/bin/bash', '--noprofile', '--norc'] : ['/bin/sh'];
    this.#proc = new SandboxProcess(target, processSpecFor(target, args, { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths }), { stdin: true, maxOutputBytes: 0 });
    this.#proc.onOutput((stream: StreamName, raw: Buffer) => {
      const cur = this.#current;
      if (!cur) return; // output between commands (e.g. from a background job) belongs to no command
      cur[stream].push(raw);
      if (cur.stdout.found !== undefined && cur.stderr.found !== undefined) cur.wake();
    });
    void this.#proc.done.then(() => this.#current?.wake());
  }

  get alive(): boolean {
    return this.#proc.exit === undefined;
  }

  info(): SessionInfo {
    return { id: this.id, shell: this.shell, alive: this.alive, busy: this.#busy, commands: this.commands, createdAt: this.createdAt.toISOString() };
  }

  /** Runs one command in the session; concurrent calls queue in order. */
  exec(req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    const run = this.#queue.then(() => this.#run(req, signal));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #run(req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    if (!this.alive) throw new SessionClosedError(this.id);
    this.#busy = true;
    this.commands++;
    const started = performance.now();
    const nonce = randomBytes(12).toString('hex');
    const marker = `__DSEC_END_${nonce}`;
    const cap = req.maxOutputBytes ?? 1 << 20;
    const stdout = new MarkerScanner(Buffer.from(`\n${marker}`), cap);
    const stderr = new MarkerScanner(Buffer.from(`\n${marker}`), cap);
    let timedOut = false;
    const oomBefore = sandboxUsage(this.#sandboxId).oomKills;
    const quoted = shellQuote(req.cmd);
    // sh (dash, busybox) exits on a syntax error inside eval, so check syntax first; bash does not.
    const body =
      this.shell === '/bin/bash'
        ? `eval ${quoted} </dev/null`
        : `if /bin/sh -n -c ${quoted} 2>/dev/null; then eval ${quoted} </dev/null; else /bin/sh -n -c ${quoted}; fi`;
    const script = `${body}\n__dsec_rc=$?; printf '\\n%s %d\\n' '${marker}' "$__dsec_rc"; printf '\\n%s\\n' '${marker}' >&2\n`;
    try {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          timedOut = true;
          this.#interrupt();
        }, req.timeoutMs ?? 60_000);
        const onAbort = (): void => this.#interrupt();
        signal?.addEventListener('abort', onAbort, { once: true });
        this.#current = {
          stdout,
          stderr,
          wake: () => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', onAbort);
            resolve();
          },
        };
        if (!this.#proc.writeStdin(Buffer.from(script))) this.#current.wake();
      });
    } finally {
      this.#current = undefined;
      this.#busy = false;
    }
    const exit = this.#proc.exit;
    const exitCode = stdout.found !== undefined ? Number(stdout.found) : (exit?.exitCode ?? 1);
    const encoding = req.encoding ?? 'utf8';
    return {
      exitCode: timedOut ? 137 : exitCode,
      stdout: stdout.output.encode(encoding),
      stderr: stderr.output.encode(encoding),
      encoding,
      truncated: stdout.output.truncated || stderr.output.truncated,
      stdoutBytes: stdout.output.total,
      stderrBytes: stderr.output.total,
      timedOut,
      oomKilled: sandboxUsage(this.#sandboxId).oomKills > oomBefore,
      durationMs: Math.round((performance.now() - started) * 100) / 100,
      sessionAlive: this.alive,
    };
  }

  /**
   * Kills what the current command started (the shell's descendants). A command made only of
   * shell builtins (`while :; do :; done`) has no process of its own: if the shell does not come
   * back within a grace period, the session ends rather than hang.
   */
  #interrupt(): void {
    const shellPid = this.#proc.hostPid;
    if (!shellPid) return;
    for (const pid of processTree(shellPid).slice(1)) killTree(pid);
    const cur = this.#current;
    setTimeout(() => {
      if (this.#current === cur && cur) this.#proc.kill();
    }, 2000).unref();
  }

  async close(): Promise<void> {
    // Jobs the session put in the background go with it: they carry the session's exec tag.
    const shellPid = this.#proc.hostPid;
    if (shellPid) for (const pid of processTree(shellPid).slice(1)) killTree(pid);
    void this.#proc.signal('SIGKILL');
    this.#proc.endStdin();
    const t = setTimeout(() => this.#proc.kill(), 1000);
    await this.#proc.done;
    clearTimeout(t);
  }
}

export class SessionClosedError extends Error {
  override readonly name = 'SessionClosedError';
  constructor(readonly sessionId: string) {
    super(`session ${sessionId} has ended (its shell exited)`);
  }
}
