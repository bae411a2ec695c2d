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
import { ApiError } from '../../api-error.js';
import { createApiKey } from '../api-keys.js';
import type { ControlPlane } from '../control-plane.js';
import type { StateStore, StoredProject } from '../state-store.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

/**
 * Projects and API keys (docs/PROJECTS.md). An admin key creates projects, sets their quotas,
 * mints and revokes keys; any key may read its own project (quota and usage).
 */
export function projectRoutes(deps: { store: Pick<StateStore, 'keys' | 'projects'>; control: ControlPlane }): FastifyPluginAsync {
  const { store, control } = deps;
  const withUsage = async (p: StoredProject): Promise<ProjectInfo> => ({
    name: p.name,
    quota: p.quota,
    usage: await store.projects.usage(p.name),
    createdAt: p.createdAt,
  });
  const project = async (name: string): Promise<StoredProject> => {
    const p = await store.projects.get(name);
    if (!p) throw new ApiError('PROJECT_NOT_FOUND', `no project ${name}; list them with \`dsec project ls\``, { project: name });
    return p;
  };
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
        if (!(await store.projects.insert(req.body.name, req.body.quota ?? {}))) {
          throw new ApiError(
            'PROJECT_EXISTS',
            `project ${req.body.name} exists already; change its quota with \`dsec project set-quota\``,
            { project: req.body.name },
          );
        }
        return reply.status(201).send(await withUsage(await project(req.body.name)));
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
        const all = req.caller.admin ? await store.projects.list() : [await project(req.caller.project)];
        return { projects: await Promise.all(all.map(withUsage)) };
      },
    );

    app.get(
      '/v1/projects/:name',
      {
        config: access.key,
        schema: { tags, summary: 'One project: quota and usage', params: ProjectNameParams, response: { 200: ProjectInfo, ...errors } },
      },
      async (req) => {
        if (!req.caller.admin && req.params.name !== req.caller.project)
          throw new ApiError('PROJECT_NOT_FOUND', `no project ${req.params.name}`, { project: req.params.name });
        return withUsage(await project(req.params.name));
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
        const p = await project(req.params.name);
        const quota = { ...p.quota, ...req.body.quota };
        for (const k of req.body.clear ?? []) delete quota[k];
        await store.projects.setQuota(p.name, quota);
        control.quotas.reset(p.name);
        return withUsage(await project(p.name));
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
        await project(req.body.project);
        const admin = req.body.admin ?? false;
        const k = await createApiKey(store, req.body.name ?? `${req.body.project} key`, { project: req.body.project, admin });
        return reply.status(201).send({ ...k, project: req.body.project, admin });
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
        return { keys: await store.keys.list(req.query.project) };
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
        if (!(await store.keys.revoke(req.params.id)))
          throw new ApiError('KEY_NOT_FOUND', `no key ${req.params.id}; list them with \`dsec key ls\``, { id: req.params.id });
        return reply.status(204).send(null);
      },
    );
  };
}
