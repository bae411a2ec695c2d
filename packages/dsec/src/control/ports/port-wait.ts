import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { PortWaitResult } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';

/** How often a refused port is tried again: a server that starts answers within this of listening. */
const RETRY_MS = 100;

/**
 * Resolves once `open(port)` gives a connection (closed at once: nothing is sent, so any protocol
 * can be waited for), trying again while it fails with PORT_NOT_LISTENING; 504 PORT_WAIT_TIMEOUT
 * after `timeoutMs`. Any other error (the sandbox is gone, not running, its edge unreachable)
 * ends the wait at once: waiting would not change it.
 */
export async function waitForPort(
  open: (port: number) => Promise<Duplex>,
  port: number,
  timeoutMs: number,
  signal: AbortSignal,
): Promise<PortWaitResult> {
  const start = performance.now();
  for (;;) {
    try {
      const conn = await open(port);
      conn.destroy();
      return { port, waitedMs: Math.round(performance.now() - start) };
    } catch (err) {
      if (!(err instanceof ApiError) || err.code !== 'PORT_NOT_LISTENING') throw err;
    }
    const left = timeoutMs - (performance.now() - start);
    if (left <= 0 || signal.aborted)
      throw new ApiError('PORT_WAIT_TIMEOUT', `nothing accepted connections on port ${port} in the sandbox within ${timeoutMs} ms`, {
        port,
        timeoutMs,
      });
    await sleep(Math.min(RETRY_MS, left)).catch(() => undefined);
  }
}
