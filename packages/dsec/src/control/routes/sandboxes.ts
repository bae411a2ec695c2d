import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  BulkRequest,
  BulkResult,
  CreateSandboxRequest,
  ForkRequest,
  ForkResult,
  ListSandboxesQuery,
  MigrateRequest,
  MigrateResult,
  NetworkPolicyRequest,
  NetworkPolicyResult,
  NetworkPolicyState,
  SandboxIdParams,
  SandboxInfo,
  SandboxCounts,
  SandboxCountsQuery,
  SandboxList,
  SnapshotRequest,
  SnapshotResult,
} from '@dsec/sdk/schema';
import { errorResponses as errors } from './error-responses.js';
import type { ControlPlane } from '../control-plane.js';
import { applyByLabels, applyByLabelsWithProgress, type BulkAction } from '../service/bulk.js';
import { NDJSON } from './exec.js';
import { absentBodyIsEmpty } from './optional-body.js';
import type { SandboxService } from '../service/sandboxes.js';
import { parseLabels } from './labels.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';
import { access } from '../../http/access.js';

/** The Content-Type Fastify gives a serialized answer. */
const JSON_UTF8 = 'application/json; charset=utf-8';

/** A project key's snapshots are its project's own images; an admin key's are shared (docs/PROJECTS.md). */
/** Sandbox lifecycle: thin handlers over the sandbox and snapshot services, as the caller. */
export function sandboxRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['sandboxes'];

    app.post(
      '/v1/sandboxes',
      {
        config: access.key,
        schema: { tags, summary: 'Create a sandbox', body: CreateSandboxRequest, response: { 201: SandboxInfo, ...errors } },
      },
      // The create's own promise, not an async handler's around it (one promise less per create).
      (req, reply) =>
        control.sandboxes.create(req.caller, req.body).then((info) => {
          void reply.status(201).send(info);
        }),
    );

    app.get(
      '/v1/sandboxes',
      {
        config: access.key,
        schema: { tags, summary: 'List sandboxes', querystring: ListSandboxesQuery, response: { 200: SandboxList, ...errors } },
      },
      async (req, reply) => {
        const filter: Parameters<SandboxService['page']>[1] = { labels: parseLabels(req.query.label) };
        if (req.query.project) filter.project = req.query.project;
        if (req.query.status) filter.status = req.query.status;
        if (req.query.limit) filter.limit = req.query.limit;
        if (req.query.after) filter.after = req.query.after;
        if (req.query.order) filter.order = req.query.order;
        // The SandboxList's JSON text, written from the store's rows (store/sandbox-info-row.ts):
        // Fastify sends a JSON string as it is, where objects would be built and then serialized.
        return reply.type(JSON_UTF8).send((await control.sandboxes.pageJson(req.caller, filter)) as never);
      },
    );

    app.get(
      '/v1/sandboxes/counts',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            "Sandboxes by status, counted in the store (the dashboard's overview): the caller's project's (an admin key: every project's)",
          querystring: SandboxCountsQuery,
          response: { 200: SandboxCounts, ...errors },
        },
      },
      async (req) => {
        const counts = await control.sandboxes.counts(req.caller, req.query.project);
        return { counts, total: Object.values(counts).reduce((a, b) => a + b, 0) };
      },
    );

    const bulk: [BulkAction, string][] = [
      ['kill', 'Kill every sandbox whose labels match (any status); a sandbox already gone counts as killed'],
      ['pause', 'Pause every running sandbox whose labels match'],
      ['resume', 'Resume every paused sandbox whose labels match'],
    ];
    for (const [action, summary] of bulk) {
      app.post(
        `/v1/sandboxes/${action}`,
        {
          config: access.key,
          schema: {
            tags,
            summary: `${summary}; with Accept: ${NDJSON}, its progress as BulkProgress lines (about every 500 ms), the last one {type: done} with the result`,
            body: BulkRequest,
            response: { 200: BulkResult, ...errors },
          },
        },
        async (req, reply) => {
          if (!(req.headers.accept ?? '').includes(NDJSON)) return applyByLabels(control.sandboxes, req.caller, req.body.labels, action);
          const lines = async function* (): AsyncGenerator<string> {
            for await (const p of applyByLabelsWithProgress(control.sandboxes, req.caller, req.body.labels, action))
              yield `${JSON.stringify(p)}\n`;
          };
          return reply.type(NDJSON).send(Readable.from(lines()) as never);
        },
      );
    }

    app.get(
      '/v1/sandboxes/:id',
      {
        config: access.key,
        schema: { tags, summary: 'Inspect a sandbox', params: SandboxIdParams, response: { 200: SandboxInfo, ...errors } },
      },
      async (req) => control.sandboxes.inspect(req.caller, req.params.id),
    );

    app.delete(
      '/v1/sandboxes/:id',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Kill a sandbox and remove all it had',
          params: SandboxIdParams,
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        await control.sandboxes.kill(req.caller, req.params.id);
        return reply.status(204).send(null);
      },
    );

    app.post(
      '/v1/sandboxes/:id/pause',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'Freeze a sandbox (memory stays resident); exec answers 409 until resumed',
          params: SandboxIdParams,
          response: { 200: SandboxInfo, ...errors },
        },
      },
      async (req) => control.sandboxes.pause(req.caller, req.params.id),
    );
    app.post(
      '/v1/sandboxes/:id/resume',
      {
        config: access.key,
        schema: { tags, summary: 'Thaw a paused sandbox', params: SandboxIdParams, response: { 200: SandboxInfo, ...errors } },
      },
      async (req) => control.sandboxes.resume(req.caller, req.params.id),
    );
    app.post(
      '/v1/sandboxes/:id/snapshot',
      {
        config: access.key,
        schema: {
          tags,
          summary: "pack_diff: capture the sandbox's changes as a new EROFS layer and register an image new sandboxes start from",
          params: SandboxIdParams,
          body: Type.Optional(SnapshotRequest),
          response: { 201: SnapshotResult, ...errors },
        },
      },
      async (req, reply) => {
        const hangup = abortOnHangup(reply);
        try {
          return reply.status(201).send(await control.snapshots.snapshot(req.caller, req.params.id, req.body ?? {}, hangup.signal));
        } finally {
          hangup.done();
        }
      },
    );
    app.post(
      '/v1/sandboxes/:id/fork',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'One snapshot of this sandbox, then count new sandboxes from it',
          params: SandboxIdParams,
          body: ForkRequest,
          response: { 201: ForkResult, ...errors },
        },
      },
      async (req, reply) => reply.status(201).send(await control.snapshots.fork(req.caller, req.params.id, req.body)),
    );
    app.post(
      '/v1/sandboxes/:id/migrate',
      {
        // Where sandboxes run is the operator's to decide: the edge or pool named, and the node's room.
        config: access.admin('moving a sandbox to another node'),
        preValidation: absentBodyIsEmpty,
        schema: {
          tags,
          summary:
            'Move a sandbox to another edge, keeping its id, labels, files, network policy, trajectory and TTL; calls on it wait meanwhile (or get the retryable SANDBOX_MIGRATING)',
          params: SandboxIdParams,
          body: Type.Optional(MigrateRequest),
          response: { 200: MigrateResult, ...errors },
        },
      },
      async (req) => control.migration.migrate(req.caller, req.params.id, req.body ?? {}),
    );

    app.put(
      '/v1/sandboxes/:id/network',
      {
        config: access.key,
        schema: {
          tags,
          summary:
            'Replace the egress policy at runtime (e.g. setup phase: allow a mirror; rollout: none); atomic, in force when the call returns',
          params: SandboxIdParams,
          body: NetworkPolicyRequest,
          response: { 200: NetworkPolicyResult, ...errors },
        },
      },
      async (req) => control.network.setPolicy(req.caller, req.params.id, req.body),
    );

    app.get(
      '/v1/sandboxes/:id/network',
      {
        config: access.key,
        schema: {
          tags,
          summary: 'The egress policy in force, and the link to the host if the sandbox has one',
          params: SandboxIdParams,
          response: { 200: NetworkPolicyState, ...errors },
        },
      },
      async (req) => control.network.getPolicy(req.caller, req.params.id),
    );
  };
}
