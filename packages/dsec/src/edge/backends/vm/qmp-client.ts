import { connect, type Socket } from 'node:net';

/**
 * A minimal QEMU Machine Protocol client: JSON lines over the VM's QMP unix socket, one command
 * at a time (the edge sends few: stop, cont, quit, query-status). Events are skipped.
 */
export class QmpClient {
  readonly #socket: Socket;
  #buf = '';
  #pending: { resolve: (v: unknown) => void; reject: (e: Error) => void } | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  #closed = false;

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => {
      this.#buf += d;
      let nl: number;
      while ((nl = this.#buf.indexOf('\n')) >= 0) {
        const line = this.#buf.slice(0, nl).trim();
        this.#buf = this.#buf.slice(nl + 1);
        if (line) this.#line(line);
      }
    });
    const gone = (): void => {
      this.#closed = true;
      this.#pending?.reject(new Error('QMP connection closed'));
      this.#pending = undefined;
    };
    socket.on('close', gone);
    socket.on('error', gone);
  }

  /** Connects, reads the greeting and leaves capabilities negotiation mode. */
  static async open(path: string): Promise<QmpClient> {
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = connect(path);
      s.once('connect', () => {
        s.removeListener('error', reject);
        resolve(s);
      });
      s.once('error', reject);
    });
    const c = new QmpClient(socket);
    await c.execute('qmp_capabilities');
    return c;
  }

  #greeted = false;
  #greeting: (() => void) | undefined;

  #line(line: string): void {
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return;
    }
    if ('QMP' in msg) {
      this.#greeted = true;
      this.#greeting?.();
      return;
    }
    if ('event' in msg) return;
    const p = this.#pending;
    this.#pending = undefined;
    if (!p) return;
    if ('error' in msg) {
      const e = msg['error'] as { desc?: string };
      p.reject(new Error(`QMP: ${e.desc ?? 'error'}`));
    } else p.resolve(msg['return']);
  }

  /** Runs one command; commands are serialised. */
  execute(command: string, args?: Record<string, unknown>): Promise<unknown> {
    const run = async (): Promise<unknown> => {
      if (!this.#greeted) await new Promise<void>((r) => (this.#greeting = r));
      if (this.#closed) throw new Error('QMP connection closed');
      return new Promise((resolve, reject) => {
        this.#pending = { resolve, reject };
        this.#socket.write(JSON.stringify(args ? { execute: command, arguments: args } : { execute: command }) + '\n');
      });
    };
    const next = this.#queue.then(run, run);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  close(): void {
    this.#socket.destroy();
  }
}
