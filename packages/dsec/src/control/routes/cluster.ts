import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { DrainRequest, DrainResult, ErrorBody, NodeInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { EdgeHeartbeatInfo, EdgeInfo } from '../../edge/protocol/schemas.js';
import { LayerSync } from '../../edge/protocol/layer-delta.js';
import type { ControlPlane } from '../control-plane.js';
import { SYSTEM } from '../service/callers.js';
import { access } from '../../http/access.js';
import { NDJSON } from './exec.js';
import { absentBodyIsEmpty } from './optional-body.js';

const EdgeIdParams = Type.Object({ id: Type.String({ pattern: '^[a-z0-9]{1,32}$' }) });
const EdgeStateReply = Type.Object({
  state: Type.Union([Type.Literal('ready'), Type.Literal('draining'), Type.Literal('lost')]),
  heartbeatMs: Type.Integer(),
  layersVersion: Type.Optional(
    Type.Integer({ description: "The version of the edge's cached layers this control plane holds now; absent: send the whole list." }),
  ),
});
const EdgeJoinReply = Type.Object({
  ...EdgeStateReply.properties,
  layerDeltas: Type.Optional(
    Type.Boolean({ description: 'Heartbeats may carry cached layers as changes (`layers`), not the whole list.' }),
  ),
  registry: Type.Optional(
    Type.Object(
      {
        repository: Type.String({
          description: 'HOST/REPOSITORY of the OCI registry the edge reads layers from first (dsec control --registry).',
        }),
        username: Type.Optional(Type.String()),
        password: Type.Optional(Type.String()),
      },
      { description: "The cluster's registry and the account to read it with; absent when the control plane has none." },
    ),
  ),
});

export const EdgeRegistrationBody = Type.Object(
  {
    id: Type.String({ pattern: '^[a-z0-9]{1,32}$', description: 'Edge id; part of every sandbox id on it.' }),
    url: Type.String({ pattern: '^https?://', maxLength: 300, description: 'Where the control plane reaches the edge protocol.' }),
    pool: Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,31}$' }),
    labels: Type.Record(Type.String({ maxLength: 63 }), Type.String({ maxLength: 63 })),
    cpuOvercommit: Type.Number({ minimum: 0 }),
    info: EdgeInfo,
  },
  { additionalProperties: false },
);

/** How often an edge reports; the control plane marks it lost after lostAfterMs of silence. */
export const HEARTBEAT_MS = 1000;

/**
 * The control plane's side of the cluster: edges join, report their capacity every second and
 * leave (all under the cluster token, /v1/cluster/…); operators drain an edge (API key).
 */
export function clusterRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['cluster'];
    app.post(
      '/v1/cluster/edges',
      {
        config: access.cluster,
        schema: {
          tags,
          summary: 'An edge joins (cluster token)',
          body: EdgeRegistrationBody,
          response: { 200: EdgeJoinReply, 400: ErrorBody, 401: ErrorBody },
        },
      },
      async (req) => ({
        ...(await control.edges.register(req.body)),
        heartbeatMs: HEARTBEAT_MS,
        layerDeltas: true,
        ...(control.registry ? { registry: control.registry.forEdges() } : {}),
      }),
    );
    app.put(
      '/v1/cluster/edges/:id/heartbeat',
      {
        config: access.cluster,
        schema: {
          tags,
          summary: "An edge's capacity, every second (cluster token); 404 asks it to join again",
          params: EdgeIdParams,
          body: Type.Object({ info: EdgeHeartbeatInfo, layers: Type.Optional(LayerSync) }),
          response: { 200: EdgeStateReply, 401: ErrorBody, 404: ErrorBody },
        },
      },
      async (req) => {
        if (req.body.info.id !== req.params.id)
          throw new ApiError('INVALID_REQUEST', `heartbeat of edge ${req.body.info.id} sent to /edges/${req.params.id}`);
        return { ...(await control.edges.heartbeat(req.params.id, req.body.info, req.body.layers)), heartbeatMs: HEARTBEAT_MS };
      },
    );
    app.delete(
      '/v1/cluster/edges/:id',
      {
        config: access.cluster,
        schema: {
          tags,
          summary: 'A drained, empty edge leaves (cluster token)',
          params: EdgeIdParams,
          response: { 204: Type.Null(), 401: ErrorBody, 404: ErrorBody, 409: ErrorBody },
        },
      },
      async (req, reply) => {
        const live = (await control.sandboxes.list(SYSTEM, {})).filter(
          (s) => s.edge === req.params.id && ['creating', 'running', 'paused'].includes(s.status),
        );
        if (live.length)
          throw new ApiError('EDGE_NOT_EMPTY', `edge ${req.params.id} still runs ${live.length} sandboxes; drain it and kill them first`, {
            sandboxes: live.length,
          });
        await control.edges.remove(req.params.id);
        return reply.status(204).send(null);
      },
    );
    app.post(
      '/v1/nodes/:id/drain',
      {
        config: access.admin('draining a node'),
        preValidation: absentBodyIsEmpty,
        schema: {
          tags: ['nodes'],
          summary: `Stop new placements on an edge (admin key); it leaves when its last sandbox is gone. With {migrate: true}, its sandboxes move to other edges: the answer is a DrainResult, or with Accept: ${NDJSON} DrainProgress lines as each moves or stays, the last one {type: done}`,
          params: EdgeIdParams,
          body: Type.Optional(DrainRequest),
          response: { 200: Type.Union([NodeInfo, DrainResult]), 400: ErrorBody, 401: ErrorBody, 403: ErrorBody, 404: ErrorBody },
        },
      },
      async (req, reply) => {
        if (!req.body?.migrate) return control.nodes.drain(req.params.id);
        const progress = control.nodes.drainMoving(req.params.id, { restartProcesses: req.body.restartProcesses === true });
        if ((req.headers.accept ?? '').includes(NDJSON)) {
          const lines = async function* (): AsyncGenerator<string> {
            for await (const p of progress) yield `${JSON.stringify(p)}\n`;
          };
          return reply.type(NDJSON).send(Readable.from(lines()) as never);
        }
        for await (const p of progress) if (p.type === 'done') return { node: p.node, moved: p.moved, stayed: p.stayed };
        throw new ApiError('INTERNAL', 'the drain ended without a result');
      },
    );
  };
}
