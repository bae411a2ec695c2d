import type { FastifyReply } from 'fastify';

/**
 * Gives `release` back once the reply is done with: sent whole, or its connection gone. A body
 * stays in this process until the client has read it (past what the socket's buffers take), so a
 * reservation for it (output-budget.ts) is held until then, not only until the answer was made.
 */
export function releaseWhenSent(reply: FastifyReply, release: () => void): void {
  const res = reply.raw;
  if (res.destroyed || res.writableFinished) release();
  else res.once('close', release);
}
