import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { SPAWN_HELPER_BINARY } from './native-helpers.js';
import type { ToolResult } from './run-tool.js';

/** How a tool's stdio is set up: all /dev/null, or stdout and stderr collected. */
export type SpawnStdio = 'ignore' | 'pipe';

interface Pending {
  resolve: (r: ToolResult) => void;
  reject: (err: Error) => void;
}

export class SpawnHelperError extends Error {
  override readonly name = 'SpawnHelperError';
}

/**
 * Host tools started by dsec-spawn (native/spawn-helper.c), a small resident process of the
 * edge's own that posix_spawn()s them, so the edge's large Node process does not fork() for each
 * call (a fork copies its page tables and leaves copy-on-write faults that slow its next
 * request). Calls may be in flight at once; each is answered when its tool has exited and its
 * pipes closed, with the exit status as runTool reports it (128 + the signal's number).
 *
 * A helper that dies fails the calls in flight (the tools themselves run on: a detached
 * container that `crun run -d` made is not the helper's, so no running sandbox is touched) and
 * the next call starts a new one. Gone when its stdin closes (also when the edge dies).
 */
export class SpawnHelper {
  #child: ChildProcessWithoutNullStreams | undefined;
  readonly #pending = new Map<number, Pending>();
  #next = 1;
  #buf = Buffer.alloc(0);
  #stderr = '';

  constructor(private readonly binary = SPAWN_HELPER_BINARY) {}

  /** Runs `tool` (looked up in PATH) with `args`; never rejects on a non-zero exit, only when the helper fails. */
  run(tool: string, args: readonly string[], opts: { stdio: SpawnStdio }): Promise<ToolResult> {
    const argv = [tool, ...args];
    if (argv.some((a) => a.includes('\0'))) return Promise.reject(new SpawnHelperError(`an argument of ${tool} contains a NUL byte`));
    const child = this.#ensure();
    const id = this.#next++;
    const body = Buffer.from(argv.map((a) => `${a}\0`).join(''));
    return new Promise<ToolResult>((resolve, reject) => {
      if (this.#pending.size === 0) this.#hold(child, true);
      this.#pending.set(id, { resolve, reject });
      child.stdin.write(`${id} ${opts.stdio} ${body.length}\n`);
      child.stdin.write(body);
    });
  }

  /** Stops the helper (it exits when its stdin closes; tools still running finish on their own). */
  async close(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    const exited = new Promise<void>((res) => child.once('exit', () => res()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }

  /** The helper's pid while it runs (tests kill it to see a restart). */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  #ensure(): ChildProcessWithoutNullStreams {
    if (this.#child) return this.#child;
    const child = spawn(this.binary, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#child = child;
    this.#buf = Buffer.alloc(0);
    this.#stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, chunk]);
      this.#drain();
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-4096)));
    const fail = (why: string): void => {
      if (this.#child !== child) return;
      this.#child = undefined;
      const err = new SpawnHelperError(`dsec-spawn ${why}${this.#stderr ? `: ${this.#stderr.trim()}` : ''}`);
      const pending = [...this.#pending.values()];
      this.#pending.clear();
      for (const p of pending) p.reject(err);
    };
    child.on('error', (err) => fail(`could not run (${err.message}; run scripts/setup to build it)`));
    child.on('exit', (code, signal) => fail(`exited (${signal ?? code})`));
    child.stdin.on('error', () => undefined); // a dead helper: reported by 'exit'
    // An idle helper must not keep the edge's process alive; one with answers due must.
    child.unref();
    this.#hold(child, false);
    return child;
  }

  #hold(child: ChildProcessWithoutNullStreams, on: boolean): void {
    // The process handle too: when the helper dies its pipes close first, and with only they
    // held, the loop could end before the exit that fails the calls in flight is seen.
    if (on) child.ref();
    else child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) {
      const h = s as unknown as { ref?: () => void; unref?: () => void };
      if (on) h.ref?.();
      else h.unref?.();
    }
  }

  /** Answers are `<id> <status> <stdout length> <stderr length>\n<stdout><stderr>`, in the order tools finish. */
  #drain(): void {
    for (;;) {
      const nl = this.#buf.indexOf(10);
      if (nl < 0) return;
      const m = /^(\d+) (\d+) (\d+) (\d+)$/.exec(this.#buf.subarray(0, nl).toString('latin1'));
      if (!m) {
        this.#child?.kill('SIGKILL'); // out of step: its 'exit' fails what is pending
        return;
      }
      const [outLen, errLen] = [Number(m[3]), Number(m[4])];
      if (this.#buf.length < nl + 1 + outLen + errLen) return;
      const stdout = this.#buf.subarray(nl + 1, nl + 1 + outLen).toString('utf8');
      const stderr = this.#buf.subarray(nl + 1 + outLen, nl + 1 + outLen + errLen).toString('utf8');
      this.#buf = this.#buf.subarray(nl + 1 + outLen + errLen);
      const id = Number(m[1]);
      const p = this.#pending.get(id);
      this.#pending.delete(id);
      if (this.#pending.size === 0 && this.#child) this.#hold(this.#child, false);
      p?.resolve({ code: Number(m[2]), stdout, stderr });
    }
  }
}
