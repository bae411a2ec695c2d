import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';

/** A Fastify server of dsec's (the API, the port-link origin, an edge), whatever its logger and raw server. */
export type App = FastifyInstance<any, any, any, any, TypeBoxTypeProvider>; // eslint-disable-line @typescript-eslint/no-explicit-any
