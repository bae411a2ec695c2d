import { randomBytes, randomInt } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { encodeFrame, frameMacOk, FrameDecoder, type AgentFrame, type AgentHeader } from './agent-frames.js';

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

/** Bytes of the channel's key (HMAC-SHA256): the edge makes one per VM, see AgentClient.giveKey. */
export const AGENT_KEY_BYTES = 32;

/**
 * What a guest takes with its key (or `renew`) to be its own after a restore: the edge's wall
 * clock, and 32 random bytes the guest kernel mixes into its RNG and reseeds from (vm-agent.c,
 * apply_identity). Guests restored from one saved state share its RNG state and clock otherwise.
 */
function guestIdentity(): { timeMs: number; seed: string } {
  return { timeMs: Date.now(), seed: randomBytes(32).toString('hex') };
}

/** A new key for a VM's channel, as stored in its record (hex). */
export function newAgentKey(): string {
  return randomBytes(AGENT_KEY_BYTES).toString('hex');
}

/**
 * The edge's end of one guest's agent channel: a unix socket QEMU serves for the guest's
 * virtio-serial port. Requests carry ids this client picks; every event the guest sends back is
 * routed by id to whoever made the request. Id 0 is the guest's own ("ready").
 *
 * A frame is taken only when the guest agent wrote it for that request (vm-agent.c, "frames"):
 * - it carries the MAC of the channel's key (frameMacOk), which only the edge and the agent's
 *   memory hold; anything else on the channel (a program in the guest that got onto the port)
 *   is refused and the channel is failed: every request still waiting fails with the reason,
 *   none reports what such a program wrote;
 * - it repeats the nonce of its request: 128 random bits, fresh for each request, so an event can
 *   only complete the request it was sent for (an id alone is a counter).
 * Before the key, only the guest's own `ready` is taken.
 */
export class AgentClient {
  readonly #socket: Socket;
  readonly #listeners = new Map<number, { fn: Listener; nonce: string }>();
  #key: Buffer | undefined;
  #refused = 0;
  readonly #onRefused = new Set<(reason: string, frame: AgentFrame) => void>();
  /**
   * Request ids start at a random point: a guest adopted after an edge restart, or restored from a
   * snapshot, still runs commands under the ids an earlier client chose, and a new request must
   * not collide with them (their late events find no listener and are dropped).
   */
  #nextId = 1 + randomInt(1 << 30);
  #closed: Error | undefined;
  readonly #onClose = new Set<(err: Error) => void>();

  private constructor(socket: Socket, key: Buffer | undefined) {
    this.#socket = socket;
    this.#key = key;
    const decoder = new FrameDecoder();
    socket.on('data', (chunk: Buffer) => {
      let frames: AgentFrame[];
      try {
        frames = decoder.push(chunk);
      } catch (err) {
        this.#fail(err as Error);
        return;
      }
      for (const f of frames) {
        if (this.#closed) return;
        this.#deliver(f);
      }
    });
    socket.on('error', (err) => this.#fail(err));
    socket.on('close', () => this.#fail(new Error('the guest agent channel closed')));
  }

  /**
   * Connects to the socket QEMU listens on. `key` (hex): the channel's key when the guest has it
   * already (an adopted or restored VM); a guest that has just booted gets it with giveKey.
   */
  static open(path: string, key?: string): Promise<AgentClient> {
    return new Promise((resolve, reject) => {
      const s = connect(path);
      s.once('connect', () => {
        s.removeListener('error', reject);
        resolve(new AgentClient(s, key === undefined ? undefined : Buffer.from(key, 'hex')));
      });
      s.once('error', reject);
    });
  }

  /**
   * Gives a guest that has just said `ready` the channel's key (op `key`), before any command
   * can run in it; its answer is the first frame with a MAC. The agent takes a key once.
   */
  async giveKey(key: string): Promise<void> {
    const k = Buffer.from(key, 'hex');
    if (k.length !== AGENT_KEY_BYTES) throw new Error(`an agent key is ${AGENT_KEY_BYTES} bytes`);
    if (this.#key) throw new Error('this channel has its key already');
    this.#key = k;
    await this.call('key', { key, ...guestIdentity() });
  }

  /**
   * Gives a guest restored with its key (a fork's) the edge's wall clock and a fresh RNG seed
   * (op `renew`): a saved state wakes up with the clock and RNG of the moment it was saved.
   */
  async renew(): Promise<void> {
    await this.call('renew', guestIdentity());
  }

  /** Frames refused so far (no valid MAC, or not carrying their request's nonce). */
  get refusedFrames(): number {
    return this.#refused;
  }

  /** Called with the reason for each frame refused (the edge logs them). */
  onRefused(fn: (reason: string, frame: AgentFrame) => void): void {
    this.#onRefused.add(fn);
  }

  #deliver(f: AgentFrame): void {
    const { id } = f.header;
    const ev = String(f.header['ev']);
    if (!this.#key) {
      if (id === 0 && ev === 'ready') this.#listeners.get(0)?.fn(f);
      else this.#refuse(`a frame (id ${id}, ${ev}) before the channel had its key`, f, true);
      return;
    }
    if (!frameMacOk(this.#key, f)) {
      this.#refuse(`a frame (id ${id}, ${ev}) without the MAC of the channel's key: the guest agent did not write it`, f, true);
      return;
    }
    const l = this.#listeners.get(id);
    if (!l) return; // a late event of a request already done
    if (f.header['nonce'] !== l.nonce) {
      this.#refuse(`an event (id ${id}, ${ev}) that does not carry its request's nonce`, f, false);
      return;
    }
    l.fn(f);
  }

  #refuse(reason: string, f: AgentFrame, fatal: boolean): void {
    this.#refused++;
    for (const fn of this.#onRefused) fn(reason, f);
    if (fatal) this.#fail(new Error(`refused ${reason}; the channel is not trusted any more`));
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
      this.#listeners.set(0, {
        nonce: '',
        fn: (f) => {
          if (f.header['ev'] === 'ready') {
            off();
            resolve();
          }
        },
      });
    });
  }

  /**
   * Sends a request and returns its id; `onEvent` gets every event for it until `release(id)`.
   * The request carries a nonce of its own that each of its events must repeat.
   */
  send(op: string, fields: Record<string, unknown>, payload?: Buffer, onEvent?: Listener): number {
    const id = this.#nextId++;
    const nonce = randomBytes(16).toString('hex');
    if (onEvent) this.#listeners.set(id, { fn: onEvent, nonce });
    this.write({ ...fields, op, id, nonce }, payload);
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
    for (const [id, l] of this.#listeners) l.fn({ header: { id, ev: 'closed', message: err.message }, payload: Buffer.alloc(0) });
    this.#listeners.clear();
  }
}
