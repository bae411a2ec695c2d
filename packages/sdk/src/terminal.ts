import WebSocket from 'ws';
import type { Connection } from './connection.js';
import { UnreachableError, errorFromWire, type DsecError } from './errors.js';

export interface TerminalOptions {
  /** argv; default bash if the image has it, else sh. */
  cmd?: string[];
  cols?: number;
  rows?: number;
  cwd?: string;
  /** Terminal output as it arrives. */
  onData: (data: Uint8Array) => void;
}

/** An interactive command under a pseudo-terminal (a REPL, vi, a shell). */
export class Terminal {
  /** Resolves with the command's exit code when it ends. */
  readonly exited: Promise<number>;

  private constructor(
    private readonly ws: WebSocket,
    exited: Promise<number>,
  ) {
    this.exited = exited;
  }

  /** Opens a terminal over a WebSocket to /v1/sandboxes/{id}/pty. */
  static async open(conn: Connection, sandboxId: string, opts: TerminalOptions): Promise<Terminal> {
    const url = new URL(`${conn.url.replace(/^http/, 'ws')}/v1/sandboxes/${sandboxId}/pty`);
    for (const c of opts.cmd ?? []) url.searchParams.append('cmd', c);
    if (opts.cols) url.searchParams.set('cols', String(opts.cols));
    if (opts.rows) url.searchParams.set('rows', String(opts.rows));
    if (opts.cwd) url.searchParams.set('cwd', opts.cwd);
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${conn.apiKey}` } });
    let exitCode: number | undefined;
    let failure: DsecError | undefined;
    const exited = new Promise<number>((resolve, reject) => {
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (isBinary) return opts.onData(new Uint8Array(data));
        const m = JSON.parse(data.toString('utf8')) as { type: string; exitCode?: number; error?: { code: string; message: string } };
        if (m.type === 'exit') exitCode = m.exitCode;
        if (m.type === 'error' && m.error) failure = errorFromWire(undefined, m.error);
      });
      ws.on('close', () => (failure ? reject(failure) : resolve(exitCode ?? 1)));
      ws.on('error', (err) => reject(new UnreachableError(`terminal connection failed: ${err.message}`, 'UNREACHABLE', undefined)));
    });
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('unexpected-response', (_req, res) =>
        reject(errorFromWire(res.statusCode, { message: `terminal refused: HTTP ${res.statusCode}` })),
      );
      ws.once('error', reject);
    });
    exited.catch(() => undefined);
    return new Terminal(ws, exited);
  }

  /** Sends keystrokes. */
  write(data: string | Uint8Array): void {
    this.ws.send(typeof data === 'string' ? Buffer.from(data, 'utf8') : data, { binary: true });
  }

  resize(cols: number, rows: number): void {
    this.ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  }

  /** Ends the command (closing the terminal kills it). */
  kill(): void {
    this.ws.close();
  }
}
