import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from '../../api-error.js';
import type { Caller } from '../api-keys.js';
import type { ControlPlane } from '../control-plane.js';
import type { StateStore } from '../state-store.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Who is calling: set by the API-key check for every /v1 and E2B control request. */
    caller: Caller;
  }
}

/** Refuses a call that takes an admin key (managing projects and keys, shared images, nodes). */
export function requireAdmin(req: FastifyRequest, what: string): void {
  if (!req.caller?.admin) {
    throw new ApiError('FORBIDDEN', `${what} takes an admin key; this key is project ${req.caller?.project ?? '?'}'s (see docs/PROJECTS.md)`, {
      project: req.caller?.project,
    });
  }
}

/**
 * A project sees only its own sandboxes and batches: every route under /v1/sandboxes/:id and
 * /v1/batches/:id (the ones there are and any added later) passes this check before its handler,
 * so no route can forget it. Another project's id answers exactly as an unknown id does.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function projectScope(app: FastifyInstance<any, any, any, any, any>, deps: { control: ControlPlane; store: StateStore }): void {
  app.addHook('preHandler', async (req, reply) => {
    const url = req.routeOptions.url ?? '';
    const caller = req.caller;
    if (!caller || caller.admin) return;
    const id = (req.params as { id?: unknown } | undefined)?.id;
    if (typeof id !== 'string') return;
    if (url.startsWith('/v1/sandboxes/:id')) {
      try {
        await deps.control.assertVisible(caller, id);
      } catch (err) {
        // A kill of an unknown id succeeds (kills are idempotent), so a kill of another
        // project's sandbox answers the same 204, and does nothing.
        if (req.method === 'DELETE' && url === '/v1/sandboxes/:id') return reply.status(204).send(null);
        throw err;
      }
    }
    else if (url.startsWith('/v1/batches/:id')) {
      const batch = await deps.store.getBatch(id);
      if (batch && batch.project !== caller.project) throw new ApiError('BATCH_NOT_FOUND', `no batch ${id}`, { id });
    }
  });
}

/** The project a list is narrowed to: the caller's own; an admin key sees all (or one it names). */
export function listScope(caller: Caller, asked?: string): string | undefined {
  return caller.admin ? asked : caller.project;
}
