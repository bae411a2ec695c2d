import { randomInt } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { encodeFrame, FrameDecoder, type AgentFrame, type AgentHeader } from './agent-frames.js';

/** An error event from the guest: the failing call's errno name (ENOENT, EISDIR, …) and message. */
export class AgentError extends Error {
  override readonly name = 'AgentError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

type Listener = (frame: AgentFrame) => void;

/**
 * The edge's end of one guest's agent channel: a unix socket QEMU serves for the guest's
 * virtio-serial port. Requests carry ids this client picks; every event the guest sends back is
 * routed by id to whoever made the request. Id 0 is the guest's own ("ready").
 */
export class AgentClient {
  readonly #socket: Socket;
  readonly #listeners = new Map<number, Listener>();
  /**
   * Request ids start at a random point: a guest adopted after an edge restart, or restored from a
   * snapshot, still runs commands under the ids an earlier client chose, and a new request must
   * not collide with them (their late events find no listener and are dropped).
   */
  #nextId = 1 + randomInt(1 << 30);
  #closed: Error | undefined;
  readonly #onClose = new Set<(err: Error) => void>();

  private constructor(socket: Socket) {
    this.#socket = socket;
    const decoder = new FrameDecoder();
    socket.on('data', (chunk: Buffer) => {
      let frames: AgentFrame[];
      try {
        frames = decoder.push(chunk);
      } catch (err) {
        this.#fail(err as Error);
        return;
      }
      for (const f of frames) this.#listeners.get(f.header.id)?.(f);
    });
    socket.on('error', (err) => this.#fail(err));
    socket.on('close', () => this.#fail(new Error('the guest agent channel closed')));
  }

  /** Connects to the socket QEMU listens on. */
  static open(path: string): Promise<AgentClient> {
    return new Promise((resolve, reject) => {
      const s = connect(path);
      s.once('connect', () => {
        s.removeListener('error', reject);
        resolve(new AgentClient(s));
      });
      s.once('error', reject);
    });
  }

  get closed(): Error | undefined {
    return this.#closed;
  }

  onClose(fn: (err: Error) => void): void {
    this.#onClose.add(fn);
  }

  /** Waits for the guest's ready event (its root is mounted and it serves requests). */
  ready(): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#closed) return reject(this.#closed);
      const off = (): void => {
        this.#listeners.delete(0);
        this.#onClose.delete(onClose);
      };
      const onClose = (err: Error): void => {
        off();
        reject(err);
      };
      this.#onClose.add(onClose);
      this.#listeners.set(0, (f) => {
        if (f.header['ev'] === 'ready') {
          off();
          resolve();
        }
      });
    });
  }

  /** Sends a request and returns its id; `onEvent` gets every event for it until `release(id)`. */
  send(op: string, fields: Record<string, unknown>, payload?: Buffer, onEvent?: Listener): number {
    const id = this.#nextId++;
    if (onEvent) this.#listeners.set(id, onEvent);
    this.write({ ...fields, op, id }, payload);
    return id;
  }

  /** A frame for an existing request (stdin, signal). */
  write(header: AgentHeader & { op: string }, payload?: Buffer): void {
    if (this.#closed) throw this.#closed;
    this.#socket.write(encodeFrame(header, payload));
  }

  release(id: number): void {
    this.#listeners.delete(id);
  }

  /**
   * A request with one answer: resolves on `ok` with its header and the payload bytes of any
   * `data` events before it (file reads), rejects on `error`.
   */
  call(op: string, fields: Record<string, unknown>, payload?: Buffer): Promise<{ header: AgentHeader; payload: Buffer; data: Buffer[] }> {
    return new Promise((resolve, reject) => {
      if (this.#closed) return reject(this.#closed);
      const data: Buffer[] = [];
      const onClose = (err: Error): void => reject(err);
      this.#onClose.add(onClose);
      const id = this.send(op, fields, payload, (f) => {
        const ev = f.header['ev'];
        if (ev === 'data') {
          data.push(f.payload);
          return;
        }
        this.release(id);
        this.#onClose.delete(onClose);
        if (ev === 'error') reject(new AgentError(String(f.header['code'] ?? 'EIO'), String(f.header['message'] ?? 'guest agent error')));
        else resolve({ header: f.header, payload: f.payload, data });
      });
    });
  }

  close(): void {
    this.#socket.destroy();
  }

  #fail(err: Error): void {
    if (this.#closed) return;
    this.#closed = err;
    this.#socket.destroy();
    for (const fn of [...this.#onClose]) fn(err);
    this.#onClose.clear();
    // Requests still waiting hear of it through their listeners as an exit-less close.
    for (const [id, l] of this.#listeners) l({ header: { id, ev: 'closed', message: err.message }, payload: Buffer.alloc(0) });
    this.#listeners.clear();
  }
}
