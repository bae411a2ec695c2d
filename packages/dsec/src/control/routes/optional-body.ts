import type { FastifyRequest } from 'fastify';

/**
 * For a route whose JSON body is optional (`POST …/drain` with or without `{migrate}`): a request
 * sent with no body at all is validated as `{}`. Fastify validates the body schema against an
 * absent body too, and refused `curl -X POST` with "body must be object".
 */
export async function absentBodyIsEmpty(req: FastifyRequest): Promise<void> {
  if (req.body === undefined || req.body === null) req.body = {};
}
