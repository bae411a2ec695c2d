import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  CreatedKey,
  CreateKeyRequest,
  CreateProjectRequest,
  KeyIdParams,
  KeyList,
  ProjectInfo,
  ProjectList,
  ProjectNameParams,
  UpdateProjectRequest,
} from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

/**
 * Projects and API keys (docs/PROJECTS.md). An admin key creates projects, sets their quotas,
 * mints and revokes keys; any key may read its own project (quota and usage).
 */
export function projectRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const projects = deps.control.projects;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['projects'];

    app.post(
      '/v1/projects',
      {
        config: access.admin('creating a project'),
        schema: { tags, summary: 'Create a project (admin key)', body: CreateProjectRequest, response: { 201: ProjectInfo, ...errors } },
      },
      async (req, reply) => {
        return reply.status(201).send(await projects.create(req.caller, req.body.name, req.body.quota ?? {}));
      },
    );

    app.get(
      '/v1/projects',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Projects with quota and usage (an admin key sees all; another key, its own)',
          response: { 200: ProjectList, ...errors },
        },
      },
      async (req) => {
        return { projects: await projects.list(req.caller) };
      },
    );

    app.get(
      '/v1/projects/:name',
      {
        config: access.key,
        schema: { tags, summary: 'One project: quota and usage', params: ProjectNameParams, response: { 200: ProjectInfo, ...errors } },
      },
      async (req) => {
        return projects.get(req.caller, req.params.name);
      },
    );

    app.patch(
      '/v1/projects/:name',
      {
        config: access.admin('changing a quota'),
        schema: {
          tags,
          summary: "Change a project's quota (admin key): quotas given are set, those in clear removed, others stay",
          params: ProjectNameParams,
          body: UpdateProjectRequest,
          response: { 200: ProjectInfo, ...errors },
        },
      },
      async (req) => {
        return projects.setQuota(req.caller, req.params.name, req.body.quota ?? {}, req.body.clear ?? []);
      },
    );

    app.post(
      '/v1/keys',
      {
        config: access.admin('creating a key'),
        schema: {
          tags,
          summary: 'Mint an API key for a project (admin key); the key is shown once',
          body: CreateKeyRequest,
          response: { 201: CreatedKey, ...errors },
        },
      },
      async (req, reply) => {
        return reply.status(201).send(await projects.createKey(req.caller, req.body));
      },
    );

    app.get(
      '/v1/keys',
      {
        config: access.admin('listing keys'),
        schema: {
          tags,
          summary: 'API keys (admin key): id, name, project, admin, revoked; never the key itself',
          querystring: Type.Object({ project: Type.Optional(Type.String()) }, { additionalProperties: false }),
          response: { 200: KeyList, ...errors },
        },
      },
      async (req) => {
        return { keys: await projects.listKeys(req.caller, req.query.project) };
      },
    );

    app.delete(
      '/v1/keys/:id',
      {
        config: access.admin('revoking a key'),
        schema: {
          tags,
          summary: 'Revoke a key (admin key): its next request is a 401',
          params: KeyIdParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await projects.revokeKey(req.caller, req.params.id);
        return reply.status(204).send(null);
      },
    );
  };
}
