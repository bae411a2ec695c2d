import { Duplex } from 'node:stream';
import { AgentError, type AgentClient } from './agent-client.js';
import type { AgentFrame } from './agent-frames.js';

/** Bytes of one port connection the agent sends before the edge grants more (see openGuestPort). */
export const PORT_WINDOW_BYTES = 256 << 10;
/** Bytes the edge sends to one guest connection before the agent says its socket took them. */
export const PORT_SEND_WINDOW_BYTES = 256 << 10;
/** The largest `send` frame: a big write goes as several, each within the send window. */
const SEND_FRAME_BYTES = 64 << 10;

/**
 * A TCP connection to `port` on the guest's own loopback, relayed by the guest agent over the
 * VM's channel (`connect`, then `data`/`eof` events and `send`/`close` requests): the guest's
 * network and the VM's egress rules are not involved, as a container's port is reached on the
 * loopback of its netns. Rejects with the agent's error (ECONNREFUSED when nothing listens).
 *
 * Flow control: the channel carries every call of the VM, so it is never paused for one slow
 * reader; instead each connection has a window. The agent sends at most PORT_WINDOW_BYTES the
 * edge has not granted back (`credit`), and the edge grants bytes back as its reader takes them
 * (push() below the stream's high-water mark, or the next read()). A guest writing faster than
 * the client reads fills its own socket buffers and blocks; the edge holds at most the window.
 * The other way, the agent queues what the guest's socket does not take yet and says what it
 * took (`sent`); the edge keeps at most PORT_SEND_WINDOW_BYTES unconfirmed and holds the
 * client's writes (their callbacks) meanwhile, so a guest server that reads slowly slows the
 * client down instead of losing bytes or stalling the agent.
 */
export function openGuestPort(agent: AgentClient, port: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    let stream: Duplex | undefined;
    /** Bytes pushed while the reader was full: granted back when it asks for more. */
    let owed = 0;
    /** Bytes sent the agent has not confirmed yet, and the client's write waiting for room. */
    let unconfirmed = 0;
    let writing: { rest: Buffer; cb: (err?: Error | null) => void } | undefined;
    const pump = (): void => {
      while (writing && unconfirmed < PORT_SEND_WINDOW_BYTES) {
        const n = Math.min(writing.rest.length, SEND_FRAME_BYTES, PORT_SEND_WINDOW_BYTES - unconfirmed);
        agent.write({ op: 'send', id }, writing.rest.subarray(0, n));
        unconfirmed += n;
        writing.rest = writing.rest.subarray(n);
        if (writing.rest.length === 0) {
          const { cb } = writing;
          writing = undefined;
          cb();
        }
      }
    };
    const grant = (bytes: number): void => {
      try {
        agent.write({ op: 'credit', id, bytes });
      } catch {
        // the channel is gone; the stream ends with it
      }
    };
    const open = (): Duplex =>
      new Duplex({
        read() {
          if (owed === 0) return;
          const n = owed;
          owed = 0;
          grant(n);
        },
        write(chunk: Buffer, _enc, cb) {
          writing = { rest: chunk, cb };
          try {
            pump();
          } catch (err) {
            writing = undefined;
            cb(err as Error);
          }
        },
        final(cb) {
          try {
            agent.write({ op: 'send', id, eof: true });
            cb();
          } catch (err) {
            cb(err as Error);
          }
        },
        destroy(err, cb) {
          agent.release(id);
          try {
            agent.write({ op: 'close', id });
          } catch {
            // the channel is gone, and the guest's socket with the VM
          }
          cb(err);
        },
      });
    const onEvent = (f: AgentFrame): void => {
      const ev = f.header['ev'];
      if (!stream) {
        if (ev === 'ok') {
          stream = open();
          resolve(stream);
          return;
        }
        agent.release(id);
        reject(
          ev === 'error'
            ? new AgentError(String(f.header['code'] ?? 'EIO'), String(f.header['message'] ?? 'connect failed'))
            : new Error(`the VM's agent channel closed: ${String(f.header['message'] ?? '')}`),
        );
        return;
      }
      if (ev === 'data') {
        if (stream.push(f.payload)) grant(f.payload.length);
        else owed += f.payload.length;
      } else if (ev === 'sent') {
        unconfirmed -= Number(f.header['bytes'] ?? 0);
        try {
          pump();
        } catch (err) {
          stream.destroy(err as Error);
        }
      } else if (ev === 'eof') stream.push(null);
      else if (ev === 'closed') stream.destroy(new Error(`the VM's agent channel closed: ${String(f.header['message'] ?? '')}`));
    };
    const id = agent.send('connect', { port, window: PORT_WINDOW_BYTES, acks: true }, undefined, onEvent);
  });
}
