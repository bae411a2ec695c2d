import type { TerminalChannel } from '../../edge/protocol/edge-api.js';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';

export type PtyListener = (data: Buffer) => void;

/**
 * One E2B PTY: a terminal the control plane opened in the sandbox, with listeners for its output
 * (a PTY's bytes go to whichever streams are attached, as E2B's Connect re-attaches to one) and its
 * exit. The only place the E2B layer touches the terminal API, so a change of that API stays here.
 */
export class PtySession {
  readonly #listeners = new Set<PtyListener>();
  readonly exit: Promise<number>;
  exitCode: number | undefined;

  private constructor(private readonly proc: TerminalChannel) {
    proc.onData((b) => {
      for (const l of this.#listeners) l(b);
    });
    this.exit = proc.exit.then((code) => (this.exitCode = code));
  }

  static async open(
    control: ControlPlane,
    side: SandboxSide,
    opts: { cmd: string[]; cols: number; rows: number; cwd: string; env: Record<string, string> },
  ): Promise<PtySession> {
    const proc = await control.exec.openTerminal(side.caller, side.sandboxId, opts, { cmd: opts.cmd, via: 'e2b' });
    return new PtySession(proc);
  }

  listen(l: PtyListener): () => void {
    this.#listeners.add(l);
    return () => this.#listeners.delete(l);
  }

  write(data: Buffer): void {
    this.proc.write(data);
  }

  resize(cols: number, rows: number): void {
    this.proc.resize(Math.min(Math.max(cols, 1), 1000), Math.min(Math.max(rows, 1), 1000));
  }

  kill(): void {
    this.proc.kill();
  }
}
