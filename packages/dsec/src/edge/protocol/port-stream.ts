import type { Duplex } from 'node:stream';
import type { WebSocket } from 'ws';
import { parsePortFrame, webSocketStream, type ErrorCode, type PortFrame } from '@dsec/sdk';
import { ApiError } from '../../api-error.js';

/**
 * The port channel's framing (binary frames are the bytes; text frames ready, error, end) is the
 * SDK's (`webSocketStream`), shared by the edge protocol and the public `/v1/sandboxes/{id}/tcp/{port}`.
 */
export { webSocketStream as webSocketDuplex, type PortFrame };

/** The frame an open failure is sent as. */
export function errorFrame(err: unknown): string {
  const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
  return JSON.stringify({ type: 'error', error: { code: e.code, message: e.message, details: e.details } } satisfies PortFrame);
}

/**
 * Waits for the serving side's first frame: resolves on ready, rejects with its error (an
 * ApiError with the registry code) or when the socket closes first. Attach before the socket
 * opens: ws parses frames that came with the upgrade answer in the tick it emits 'open'.
 */
export function awaitReady(ws: WebSocket, who: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const onMessage = (msg: Buffer, isBinary: boolean): void => {
      if (isBinary) return;
      const m = parsePortFrame(msg);
      if (m?.type === 'ready') done();
      else if (m?.type === 'error') done(new ApiError(m.error.code as ErrorCode, m.error.message, m.error.details ?? {}));
    };
    const onClose = (): void => done(new ApiError('EDGE_UNAVAILABLE', `${who} closed the port channel before it opened`));
    const onError = (err: Error): void => done(new ApiError('EDGE_UNAVAILABLE', `${who}: ${err.message}`));
    const onUnexpected = (_req: unknown, res: { statusCode?: number }): void =>
      done(
        new ApiError(
          res.statusCode === 401 ? 'UNAUTHORIZED' : 'EDGE_UNAVAILABLE',
          `${who} refused the port channel: HTTP ${res.statusCode}`,
        ),
      );
    const done = (err?: Error): void => {
      ws.off('message', onMessage);
      ws.off('close', onClose);
      ws.off('error', onError);
      ws.off('unexpected-response', onUnexpected);
      if (err) {
        ws.terminate();
        reject(err);
      } else resolve();
    };
    ws.on('message', onMessage);
    ws.on('close', onClose);
    ws.on('error', onError);
    ws.on('unexpected-response', onUnexpected);
  });
}

/**
 * Joins two byte streams both ways, passing a half-close on in each direction. A stream that
 * fails, or closes before the other was told it ended, takes the other down with it; otherwise
 * each closes by itself once both of its directions are done. Resolves once both are closed.
 */
export function bridge(a: Duplex, b: Duplex): Promise<void> {
  return new Promise((resolve) => {
    let closed = 0;
    const onClose = (other: Duplex) => (): void => {
      if (!other.writableEnded) other.destroy();
      if (++closed === 2) resolve();
    };
    a.once('close', onClose(b));
    b.once('close', onClose(a));
    a.on('error', () => b.destroy());
    b.on('error', () => a.destroy());
    a.pipe(b);
    b.pipe(a);
  });
}

/**
 * Serves one port channel on a WebSocket that was just accepted: the stream exists from the
 * start (bytes the client sends before the connection is made wait in it), then `open`'s
 * connection is announced with a `ready` frame and joined to it, or its failure is sent as an
 * `error` frame and the socket closed. The edge's port route and the control plane's tcp route.
 */
export async function servePortChannel(socket: WebSocket, open: () => Promise<Duplex>): Promise<void> {
  const stream = webSocketStream(socket);
  let conn: Duplex;
  try {
    conn = await open();
  } catch (err) {
    socket.send(errorFrame(err));
    socket.close(1011, 'port');
    return;
  }
  socket.send(JSON.stringify({ type: 'ready' }));
  await bridge(stream, conn);
}
