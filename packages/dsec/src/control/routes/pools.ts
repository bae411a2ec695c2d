import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { CreatePoolRequest, PoolInfo, PoolList, PoolNameParams } from '@dsec/sdk/schema';
import type { WarmPools } from '../service/pools.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

/** Warm pools: thin handlers over WarmPools (creates claim from them through POST /v1/sandboxes). */
export function poolRoutes(deps: { pools: WarmPools }): FastifyPluginAsync {
  const { pools } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['pools'];

    app.post(
      '/v1/pools',
      {
        config: access.admin('creating a warm pool'),
        schema: {
          tags,
          summary:
            'Create a warm pool: `size` ready sandboxes of one spec, refilled in the background; a create naming the pool (or matching its spec) claims one',
          body: CreatePoolRequest,
          response: { 201: PoolInfo, ...errors },
        },
      },
      async (req, reply) => {
        // A pool's sandboxes are shared infrastructure (project default until claimed): an operator's.
        return reply.status(201).send(await pools.create(req.body));
      },
    );
    app.get(
      '/v1/pools',
      {
        config: access.key,
        schema: { tags, summary: 'List warm pools with sizes, claims, misses and refill times', response: { 200: PoolList, ...errors } },
      },
      async () => ({
        pools: pools.list(),
      }),
    );
    app.get(
      '/v1/pools/:name',
      { config: access.key, schema: { tags, summary: 'One warm pool', params: PoolNameParams, response: { 200: PoolInfo, ...errors } } },
      async (req) => pools.get(req.params.name),
    );
    app.delete(
      '/v1/pools/:name',
      {
        config: access.admin('deleting a warm pool'),
        schema: {
          tags,
          summary: "Delete a warm pool and kill its unclaimed sandboxes (claimed ones stay their callers')",
          params: PoolNameParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await pools.delete(req.params.name);
        return reply.status(204).send(null);
      },
    );
  };
}
