import type { FastifyInstance, FastifyRequest } from 'fastify';
import { releaseWhenSent } from '../http/release-when-sent.js';
import { holdAnswer, UNRESERVED_OUTPUT_BYTES, type OutputBudget } from '../output-budget.js';
import { admittedSandbox } from './e2b/sandbox-access.js';
import { JSON_BODY_LIMIT } from '../http/http-errors.js';
import { BODY_LIMIT as LARGEST_BODY } from './e2b/sandbox-routes.js';

/** Content types the API's routes read whole into memory before their handler (the rest stream: tar, layers, archives). */
const READ_WHOLE = /^(application\/(json|octet-stream|connect\+json|x-www-form-urlencoded)|multipart\/form-data|text\/)/i;

/**
 * A body read whole holds what it declares past the free 2 MiB of the output budget from its headers
 * until its answer is sent (its Content-Length, else its type's limit; no more than the largest
 * body any route reads, E2B's uploads'): slow senders cannot
 * hold the routes' 16–65 MiB each without end. Every route, not only uploads: a JSON route sent
 * 64 MiB of octet-stream buffers it before validation refuses it, as a process's stdin does.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function holdBodiesReadWhole(app: FastifyInstance<any, any, any, any, any>, budget: OutputBudget): void {
  app.addHook('preParsing', (req, reply, payload, done) => {
    const type = req.headers['content-type'] ?? 'application/json';
    const length = Number(req.headers['content-length']);
    // A chunked body declares nothing: it may be as large as its type's limit.
    const limit = /^(application\/octet-stream|multipart\/)/i.test(type) ? LARGEST_BODY : JSON_BODY_LIMIT;
    const declared = Number.isFinite(length) ? Math.min(length, LARGEST_BODY) : req.headers['transfer-encoding'] ? limit : 0;
    if (declared <= 2 * UNRESERVED_OUTPUT_BYTES || !READ_WHOLE.test(type)) {
      done(null, payload);
      return;
    }
    try {
      holdAnswer(
        budget,
        ownerOf(req),
        declared,
        "this request's body",
        (release) => releaseWhenSent(reply, release),
        "send files as a tar stream (PUT …/files/tar), or retry once this project's earlier requests have been answered",
      );
    } catch (err) {
      done(err as Error);
      return;
    }
    done(null, payload);
  });
}

/** Whose share a body takes: its API key's project, an E2B sandbox token's sandbox's, else the unauthenticated's. */
function ownerOf(req: FastifyRequest): string {
  if (req.callerIfAny) return req.callerIfAny.project;
  try {
    return admittedSandbox(req).project ?? 'anonymous';
  } catch {
    return 'anonymous';
  }
}
