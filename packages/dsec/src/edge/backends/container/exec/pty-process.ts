import { randomBytes } from 'node:crypto';
import { closeSync, constants as fsc, openSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pty, { type IPty } from 'node-pty';
import { readPidFile } from '../crun.js';
import { processBlock } from '../oci-config.js';
import { isProcessAlive, killTree } from '../../../../host/process-tree.js';
import { setWindowSize } from '../../../../host/syscalls.js';
import { SANDBOX_OOM_SCORE_ADJ } from '../../../../host/node-memory.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';

export interface PtyOptions {
  cmd: string[];
  cols: number;
  rows: number;
  cwd?: string | undefined;
  env?: Record<string, string>;
}

/**
 * An interactive command under a pseudo-terminal, for tools such as a REPL or vi. `crun exec -t`
 * allocates the terminal inside the sandbox's own devpts (the command sees a real /dev/pts/N);
 * crun itself runs on a host pty from node-pty and relays bytes. Resizes are applied with
 * TIOCSWINSZ on the sandbox-side terminal (reached through /proc/<pid>/fd/0), which delivers
 * SIGWINCH to the command.
 */
export class PtyProcess {
  readonly exit: Promise<number>;
  readonly #pty: IPty;
  readonly #pidFile: string;
  #exited = false;

  constructor(target: ExecTarget, opts: PtyOptions) {
    const tag = randomBytes(6).toString('hex');
    const specFile = join(target.scratchDir, `pty-${tag}.json`);
    this.#pidFile = join(target.scratchDir, `pty-${tag}.pid`);
    const spec = processSpecFor(target, opts.cmd, { cwd: opts.cwd, env: { TERM: 'xterm-256color', ...opts.env } });
    writeFileSync(specFile, JSON.stringify(processBlock({ ...spec, terminal: true })));
    // choom (util-linux) sets the terminal's OOM score, which crun exec does not apply from the spec.
    this.#pty = pty.spawn(
      'choom',
      [
        '-n',
        String(SANDBOX_OOM_SCORE_ADJ),
        '--',
        'crun',
        ...target.crun.globalArgs(),
        'exec',
        '--process',
        specFile,
        '--pid-file',
        this.#pidFile,
        target.id,
      ],
      {
        cols: opts.cols,
        rows: opts.rows,
        env: { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin', TERM: 'xterm-256color' },
      },
    );
    this.#holdUntilDrained();
    this.exit = new Promise((resolve) => {
      this.#pty.onExit(({ exitCode, signal }) => {
        this.#exited = true;
        rmSync(specFile, { force: true });
        rmSync(this.#pidFile, { force: true });
        resolve(signal ? 128 + signal : exitCode);
      });
    });
  }

  onData(listener: (data: string) => void): void {
    this.#pty.onData(listener);
  }

  write(data: string | Buffer): void {
    if (!this.#exited) this.#pty.write(data);
  }

  resize(cols: number, rows: number): void {
    if (this.#exited) return;
    this.#pty.resize(cols, rows);
    const pid = this.#hostPid();
    if (!pid) return;
    try {
      const fd = openSync(`/proc/${pid}/fd/0`, fsc.O_RDWR | fsc.O_NOCTTY | fsc.O_NONBLOCK);
      try {
        setWindowSize(fd, cols, rows);
      } finally {
        closeSync(fd);
      }
    } catch {
      // the command is exiting
    }
  }

  kill(): void {
    const pid = this.#hostPid();
    if (pid) killTree(pid);
    if (!this.#exited) this.#pty.kill('SIGKILL');
  }

  #hostPid(): number | undefined {
    return readPidFile(this.#pidFile);
  }

  /**
   * node-pty reads the master until EIO, which Linux gives once the last slave fd closes, and
   * output still in flight at that moment can be dropped (measured with plain node-pty, no
   * crun: `seq 1 20000` lost its tail in 11 of 40 runs). So the edge holds a slave fd of its own
   * (node-pty's slave path is internal: `_pty`, node-pty 1.1) and closes it only once crun has
   * exited and no output came for 20 ms; then the master sees EIO and node-pty reports the exit.
   */
  #holdUntilDrained(): void {
    const slave = (this.#pty as unknown as { _pty?: unknown })._pty;
    if (typeof slave !== 'string') return;
    let hold: number;
    try {
      hold = openSync(slave, fsc.O_RDWR | fsc.O_NOCTTY);
    } catch {
      return; // no hold: exits as node-pty sees them
    }
    let lastData = performance.now();
    this.#pty.onData(() => (lastData = performance.now()));
    const pid = this.#pty.pid;
    const timer = setInterval(() => {
      if (isProcessAlive(pid) || performance.now() - lastData < 20) return;
      clearInterval(timer);
      closeSync(hold);
    }, 10);
  }
}
