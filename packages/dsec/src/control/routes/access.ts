import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../api-error.js';
import type { Caller } from '../api-keys.js';
import type { StateStore } from '../state-store.js';

/**
 * Refuses a call that takes an admin key for only some of what the route does (building a shared
 * image, not a project's); a route that is admin-only as a whole declares `access.admin(…)`.
 */
export function requireAdmin(req: FastifyRequest, what: string): void {
  // Reading req.caller throws UNAUTHORIZED when no key came: never a silent pass.
  const caller = req.caller;
  if (!caller.admin) {
    throw new ApiError('FORBIDDEN', `${what} takes an admin key; this key is project ${caller.project}'s (see docs/PROJECTS.md)`, {
      project: caller.project,
    });
  }
}

/**
 * A project sees only its own batches: every route under /v1/batches/:id (the ones there are and
 * any added later) passes this check before its handler, so no route can forget it. Another
 * project's id answers exactly as an unknown id does. (A sandbox's routes need no hook: every
 * service method that names a sandbox takes the caller and decides, control/service/.)
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function projectScope(app: FastifyInstance<any, any, any, any, any>, deps: { store: StateStore }): void {
  app.addHook('preHandler', async (req) => {
    const url = req.routeOptions.url ?? '';
    if (!url.startsWith('/v1/batches/:id')) return;
    // These routes are declared for API keys: reading the caller throws UNAUTHORIZED if none came.
    const caller = req.caller;
    if (caller.admin) return;
    const id = (req.params as { id?: unknown } | undefined)?.id;
    if (typeof id !== 'string') throw new ApiError('INVALID_REQUEST', 'the path names no id', { field: 'id' });
    const batch = await deps.store.getBatch(id);
    if (batch && batch.project !== caller.project) throw new ApiError('BATCH_NOT_FOUND', `no batch ${id}`, { id });
  });
}

/** The project a list is narrowed to: the caller's own; an admin key sees all (or one it names). */
export function listScope(caller: Caller, asked?: string): string | undefined {
  return caller.admin ? asked : caller.project;
}
