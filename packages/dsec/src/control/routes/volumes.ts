import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { CreateVolumeRequest, VolumeInfo, VolumeList, VolumeNameParams } from '@dsec/sdk/schema';
import type { Volumes } from '../service/volumes.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

/** Named volumes: thin handlers over Volumes. */
export function volumeRoutes(deps: { volumes: Volumes }): FastifyPluginAsync {
  const { volumes } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['volumes'];
    app.post(
      '/v1/volumes',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Create a named volume (a persistent directory on one edge)',
          body: CreateVolumeRequest,
          response: { 201: VolumeInfo, ...errors },
        },
      },
      async (req, reply) => reply.status(201).send(await volumes.create(req.body, req.caller)),
    );
    app.get(
      '/v1/volumes',
      {
        config: access.key,
        schema: {
          tags,
          summary: "List the project's volumes (every project's for an admin key), with the sandboxes that mount each",
          response: { 200: VolumeList, ...errors },
        },
      },
      async (req) => ({
        volumes: await volumes.list(req.caller),
      }),
    );
    app.get(
      '/v1/volumes/:name',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Inspect a volume: its edge, who mounts it, the size of its files',
          params: VolumeNameParams,
          response: { 200: VolumeInfo, ...errors },
        },
      },
      async (req) => volumes.get(req.params.name, req.caller),
    );
    app.delete(
      '/v1/volumes/:name',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Delete a volume and its files (409 VOLUME_IN_USE while a sandbox mounts it)',
          params: VolumeNameParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await volumes.delete(req.params.name, req.caller);
        return reply.status(204).send(null);
      },
    );
  };
}
