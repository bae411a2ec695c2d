import type { FastifyRequest } from 'fastify';
import { ApiError } from '../api-error.js';

/**
 * Refuses request targets that reach a route by another spelling than its own: the router
 * reduces an absolute-form target (`http://host/v1/…`) to its path and decodes `%76` to `v`
 * before it matches, so a check on the raw URL and the route that answers can disagree (that is
 * how every /v1 route once answered without a key). Access is decided from the matched route
 * anyway; this keeps the two spellings equal, so logs, proxies and checks read what ran.
 * - the target must be origin-form (start with a single `/`);
 * - every static segment of the matched route must appear in the path exactly, not encoded.
 */
export function checkRequestTarget(req: FastifyRequest): void {
  const original = req.originalUrl;
  if (!original.startsWith('/') || original.startsWith('//'))
    throw new ApiError(
      'INVALID_REQUEST',
      `the request target must be a path starting with one "/" (origin-form), not ${JSON.stringify(original.slice(0, 100))}`,
      {
        field: 'target',
      },
    );
  const pattern = req.routeOptions.url;
  if (!pattern) return;
  // The URL as routed (after the E2B rewrite, whose prefix is itself static), without its query.
  const q = req.url.indexOf('?');
  const path = q < 0 ? req.url : req.url.slice(0, q);
  // Written as the route is (a route without parameters, such as a create's): nothing to compare.
  if (path === pattern) return;
  const want = pattern.split('/');
  const got = path.split('/');
  for (let i = 0; i < want.length; i++) {
    const seg = want[i]!;
    if (seg === '*' || seg.endsWith('*')) return;
    if (seg.includes(':')) continue; // a parameter (or a segment holding one): any spelling, decoded by the router
    if (got[i] !== seg)
      throw new ApiError(
        'INVALID_REQUEST',
        `path segment ${JSON.stringify(got[i] ?? '')} must be written ${JSON.stringify(seg)} (no percent-encoding in a route's fixed segments)`,
        {
          field: 'target',
        },
      );
  }
}
