import type { FastifyReply } from 'fastify';

/**
 * An AbortSignal that fires when the client hangs up before the response is complete, so the
 * command it asked for does not run on for nobody. (The response's close, not the request's: a
 * request "closes" as soon as its body has been read.)
 */
export function abortOnHangup(reply: FastifyReply): { signal: AbortSignal; done: () => void } {
  const ctrl = new AbortController();
  const onClose = (): void => {
    if (!reply.raw.writableFinished) ctrl.abort();
  };
  reply.raw.on('close', onClose);
  return { signal: ctrl.signal, done: () => reply.raw.off('close', onClose) };
}
