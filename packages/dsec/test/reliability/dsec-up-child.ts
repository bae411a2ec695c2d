/**
 * `dsec up` as a child process on a test data dir, so a test can SIGKILL it (a crash: nothing is
 * cleaned up, sandboxes keep running) and start it again on the same data dir.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';

export const MAIN = new URL('../../src/cli/main.js', import.meta.url).pathname;

export class DsecUpChild {
  child: ChildProcess | undefined;
  conn = { url: '', apiKey: '' };
  stderr = '';

  constructor(
    readonly dataDir: string,
    readonly edgeId: string,
    /** Another entry than the CLI's main (test support that wraps it, e.g. dsec-up-measured.ts), and environment to add. */
    readonly opts: { entry?: string; env?: Record<string, string> } = {},
  ) {}

  get pid(): number | undefined {
    return this.child?.pid;
  }

  get running(): boolean {
    const c = this.child;
    return !!c && c.exitCode === null && c.signalCode === null;
  }

  /** Starts dsec up and waits for its client.json (written once it serves). */
  async start(): Promise<void> {
    const clientFile = join(this.dataDir, 'client.json');
    rmSync(clientFile, { force: true });
    const args = [
      this.opts.entry ?? MAIN,
      'up',
      '--data-dir',
      this.dataDir,
      '--listen',
      '127.0.0.1:0',
      '--edge-id',
      this.edgeId,
      '--log-level',
      'error',
    ];
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...this.opts.env } });
    this.child = child;
    this.stderr = '';
    child.stderr!.on('data', (d: Buffer) => (this.stderr += d.toString()));
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    for (;;) {
      if (child.exitCode !== null) throw new Error(`dsec up exited ${child.exitCode} at start: ${this.stderr}`);
      if (existsSync(clientFile)) {
        try {
          this.conn = JSON.parse(readFileSync(clientFile, 'utf8')) as typeof this.conn;
          return;
        } catch {
          // being written
        }
      }
      await Promise.race([exited, new Promise((r) => setTimeout(r, 50))]);
    }
  }

  /** kill -9, and wait until it is gone. */
  async crash(): Promise<void> {
    await this.#signal('SIGKILL');
  }

  /** SIGTERM (sandboxes keep running), and wait until it is gone. */
  async stop(): Promise<void> {
    await this.#signal('SIGTERM');
  }

  async #signal(sig: NodeJS.Signals): Promise<void> {
    const c = this.child;
    if (!c) return;
    const gone = new Promise<void>((resolve) =>
      c.exitCode !== null || c.signalCode !== null ? resolve() : c.once('exit', () => resolve()),
    );
    c.kill(sig);
    await gone;
    this.child = undefined;
  }
}
