import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../api-error.js';
import type { Caller } from '../api-keys.js';
import type { ControlPlane } from '../control-plane.js';
import type { StateStore } from '../state-store.js';

/**
 * A project sees only its own sandboxes and batches. The services decide for a sandbox (every
 * method that names one takes the caller, control/service/); this hook asks them before any
 * handler of a route under /v1/sandboxes/:id runs, so a WebSocket is refused before its upgrade
 * and a stream before its first byte, and a route added later cannot answer first. Batches are
 * decided here. Another project's id answers exactly as an unknown id does.
 */
export function projectScope(
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  app: FastifyInstance<any, any, any, any, any>,
  deps: { control: ControlPlane; store: Pick<StateStore, 'batches'> },
): void {
  // A callback hook: most routes are not scoped, and an async hook would be a promise and a turn
  // of microtasks for each of their requests (a create's among them).
  app.addHook('preHandler', (req, reply, done) => {
    const url = req.routeOptions.url ?? '';
    const scoped = url.startsWith('/v1/sandboxes/:id') || url.startsWith('/v1/batches/:id');
    if (!scoped) return done();
    scopeCheck(req, reply, url).then(
      () => done(),
      (err: unknown) => done(err as FastifyError),
    );
  });

  const scopeCheck = async (req: FastifyRequest, reply: FastifyReply, url: string): Promise<void> => {
    // These routes are declared for API keys: reading the caller throws UNAUTHORIZED if none came.
    const caller = req.caller;
    if (caller.admin) return;
    const id = (req.params as { id?: unknown } | undefined)?.id;
    if (typeof id !== 'string') throw new ApiError('INVALID_REQUEST', 'the path names no id', { field: 'id' });
    if (url.startsWith('/v1/sandboxes/:id')) {
      try {
        await deps.control.sandboxes.assertVisible(caller, id);
      } catch (err) {
        // A kill of an unknown id succeeds (kills are idempotent), so a kill of another
        // project's sandbox answers the same 204, and does nothing (the handler does not run
        // once the reply is sent).
        if (req.method === 'DELETE' && url === '/v1/sandboxes/:id') {
          void reply.status(204).send(null);
          return;
        }
        throw err;
      }
    } else if (url.startsWith('/v1/batches/:id')) {
      const batch = await deps.store.batches.get(id);
      if (batch && batch.project !== caller.project) throw new ApiError('BATCH_NOT_FOUND', `no batch ${id}`, { id });
    }
  };
}

/** The project a list is narrowed to: the caller's own; an admin key sees all (or one it names). */
export function listScope(caller: Caller, asked?: string): string | undefined {
  return caller.admin ? asked : caller.project;
}
