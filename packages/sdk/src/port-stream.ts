import { Duplex } from 'node:stream';
import type WebSocket from 'ws';

/**
 * A TCP byte stream carried over a WebSocket: the framing of a sandbox port channel, both on the
 * edge protocol (control plane ↔ edge) and on the public API (`/v1/sandboxes/{id}/tcp/{port}`).
 * Binary frames are the bytes. Text frames are JSON control messages: the serving side sends
 * `{type:"ready"}` once the connection inside the sandbox is made (or `{type:"error",error}` and
 * closes); either side sends `{type:"end"}` when it has no more to write (TCP half-close), and
 * closing the socket ends the stream both ways.
 */
export type PortFrame =
  { type: 'ready' } | { type: 'end' } | { type: 'error'; error: { code: string; message: string; details?: Record<string, unknown> } };

/**
 * The WebSocket as a Duplex of the stream's bytes. Make it as soon as the socket exists (binary
 * frames that arrive before anyone reads wait in it); write only once the channel is ready.
 */
export function webSocketStream(ws: WebSocket): Duplex {
  let paused = false;
  const duplex = new Duplex({
    allowHalfOpen: true,
    read() {
      if (paused) {
        paused = false;
        ws.resume();
      }
    },
    write(chunk: Buffer, _enc, cb) {
      if (ws.readyState !== ws.OPEN) return cb(new Error('port channel closed'));
      ws.send(chunk, { binary: true }, (err) => cb(err ?? null));
    },
    final(cb) {
      if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ type: 'end' } satisfies PortFrame), () => cb());
      else cb();
    },
    destroy(err, cb) {
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close(err ? 1011 : 1000);
      cb(err);
    },
  });
  ws.on('message', (msg: Buffer, isBinary: boolean) => {
    if (isBinary) {
      if (!duplex.push(msg) && !paused) {
        paused = true;
        ws.pause();
      }
      return;
    }
    if (parsePortFrame(msg)?.type === 'end') duplex.push(null);
  });
  ws.on('close', () => {
    duplex.push(null);
    // Whatever was still to be written cannot arrive any more.
    if (!duplex.writableFinished) duplex.destroy();
  });
  ws.on('error', (err) => duplex.destroy(err));
  return duplex;
}

export function parsePortFrame(msg: Buffer | string): PortFrame | undefined {
  try {
    const m = JSON.parse(typeof msg === 'string' ? msg : msg.toString('utf8')) as PortFrame;
    return typeof m === 'object' && m !== null && typeof m.type === 'string' ? m : undefined;
  } catch {
    return undefined;
  }
}
