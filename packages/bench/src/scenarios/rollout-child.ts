/**
 * A client process of `dsec bench rollout`, spoken to in JSON lines (one request on its stdin, one
 * answer on its stdout). The SDK clients run in processes of their own, as a trainer does: the
 * bench's dsec serves from this process, and a client loop here would take its event loop.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';

export class LineChild {
  #child?: ChildProcessWithoutNullStreams;
  #lines?: AsyncIterator<string>;
  #stderr = '';

  constructor(
    private readonly bin: string,
    private readonly args: string[],
    private readonly env: NodeJS.ProcessEnv = process.env,
  ) {}

  /** Sends `req` (starting the process on first use) and resolves with its answer; an `error` answer throws. */
  async ask(req: object): Promise<Record<string, unknown>> {
    if (!this.#child) {
      const child = spawn(this.bin, this.args, { env: this.env, stdio: ['pipe', 'pipe', 'pipe'] });
      child.stderr.on('data', (d: Buffer) => void (this.#stderr = (this.#stderr + d.toString()).slice(-4000)));
      child.on('error', (err) => void (this.#stderr += `\n${err.message}`));
      this.#child = child;
      this.#lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    }
    this.#child.stdin.write(JSON.stringify(req) + '\n');
    const next = await this.#lines!.next();
    if (next.done) throw new Error(`${this.args.at(-1)} ended: ${this.#stderr.trim().split('\n').slice(-6).join('\n') || 'no output'}`);
    const answer = JSON.parse(next.value) as Record<string, unknown>;
    if (typeof answer['error'] === 'string') throw new Error(answer['error']);
    return answer;
  }

  /** Asks it to close (`{op: 'close'}`: it removes what it made, then exits), and waits; killed after `graceMs`. */
  async close(graceMs = 60_000): Promise<void> {
    const child = this.#child;
    this.#child = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.stdin.end(JSON.stringify({ op: 'close' }) + '\n');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }
}
