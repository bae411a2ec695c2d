import { PassThrough, Readable } from 'node:stream';
import swagger from '@fastify/swagger';
import websocket from '@fastify/websocket';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Fastify, { LogController } from 'fastify';
import type { Logger } from 'pino';
import { Type } from 'typebox';
import {
  ExecRequest,
  ExecResult,
  FnRunResult,
  MAX_FILE_BYTES,
  OpenSessionRequest,
  ProcessInfo,
  ProcessList,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  SessionList,
  SignalRequest,
  StartProcessRequest,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { access, enforceAccess } from '../../http/access.js';
import { bearerMatches } from '../../http/credentials.js';
import { errorHandler } from '../../http/http-errors.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';
import type { App } from '../../http/app.js';
import type { EdgeApi } from '../protocol/edge-api.js';
import {
  EDGE_PREFIX,
  EdgeCreateGroupRequest,
  EdgeFnRequest,
  EdgeCreateGroupResult,
  type EdgeCreateOutcome,
  EdgeCreateRequest,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeNetworkState,
  EdgeSandbox,
  EdgeSandboxList,
  EdgeQuiesce,
  EdgeQuiesceRequest,
  EdgeSnapshot,
  EdgeSnapshotRequest,
  EdgeUsage,
  EdgeVolumeUsage,
} from '../protocol/schemas.js';
import { requestIdOptions, useRequestLog } from '../../http/request-log.js';
import { eventToLine } from '../protocol/exec-lines.js';
import { channelRoutes } from './edge-channel-routes.js';
import { fileRoutes } from './edge-file-routes.js';
import { errors, Id, IdPid, IdSid, NDJSON, OCTETS } from './edge-route-schemas.js';

/**
 * The edge protocol over HTTP: what `dsec edge` serves to its control plane. Every route needs the
 * cluster token; anything else that reaches the port (a sandbox included) gets 401. Bodies and
 * answers are the protocol's schemas (documented at /edge/v1/openapi.json); output, files and tar
 * archives are raw byte streams; exec streams are NDJSON lines; terminals are WebSockets.
 */
export async function buildEdgeServer(edge: EdgeApi, opts: { token: string; log: Logger }): Promise<App> {
  const app = Fastify({
    loggerInstance: opts.log,
    bodyLimit: 16 << 20,
    logController: new LogController({ disableRequestLogging: true }),
    ...requestIdOptions,
    ajv: { customOptions: { removeAdditional: false, coerceTypes: 'array', useDefaults: true, allErrors: false } },
  }).withTypeProvider<TypeBoxTypeProvider>();
  await app.register(swagger, { openapi: { openapi: '3.0.3', info: { title: 'dsec edge protocol', version: '1' } } });
  await app.register(websocket, { options: { maxPayload: 1 << 20 } });
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler((req, reply) => {
    void reply
      .status(404)
      .send({ error: { code: 'ROUTE_NOT_FOUND', message: `no edge route ${req.method} ${req.url.split('?')[0]}`, details: {} } });
  });
  app.addContentTypeParser(OCTETS, { parseAs: 'buffer', bodyLimit: MAX_FILE_BYTES }, (_req, body, done) => done(null, body));
  app.addContentTypeParser('application/x-tar', (_req, payload, done) => done(null, payload));
  // The control plane sends its request's id: the edge's lines for that call carry the same reqId.
  useRequestLog(app, () => undefined);
  // Every route is declared `cluster`: only the control plane, holding the cluster token, calls an edge.
  const cluster = { kind: 'cluster' } as const;
  enforceAccess(app, { clusterToken: (req) => bearerMatches(req.headers.authorization, opts.token) }, { unmatched: cluster });

  const P = EDGE_PREFIX;
  const S = `${P}/sandboxes/:id`;
  app.get(`${P}/info`, { config: access.cluster, schema: { response: { 200: EdgeInfo, ...errors } } }, async () => edge.info());
  app.get(`${P}/sandboxes`, { config: access.cluster, schema: { response: { 200: EdgeSandboxList } } }, async () => ({
    sandboxes: await edge.listSandboxes(),
  }));
  app.post(
    `${P}/sandboxes`,
    { config: access.cluster, schema: { body: EdgeCreateRequest, response: { 201: EdgeSandbox, ...errors } } },
    async (req, reply) => reply.status(201).send(await edge.createSandbox(req.body)),
  );
  app.post(
    `${P}/sandboxes/group`,
    { config: access.cluster, schema: { body: EdgeCreateGroupRequest, response: { 200: EdgeCreateGroupResult, ...errors } } },
    async (req, reply) => {
      if (!(req.headers.accept ?? '').includes(NDJSON)) return { results: await edge.createSandboxes(req.body.sandboxes) };
      // `{"accepted":n}` once the creates have started, then a line per item as it settles
      // ({index, ...outcome}): the control plane answers each create of the group when it is done
      // and sends its next group without waiting for this one's slowest. Items the answer ends
      // without are the caller's to fail.
      // The lines of one turn go in one write (a simulated edge settles a whole group in a turn).
      const lines = new PassThrough();
      void reply.type(NDJSON).send(lines as never);
      let pending = '';
      const flush = (): void => {
        if (pending && !lines.destroyed) lines.write(pending);
        pending = '';
      };
      const write = (line: unknown): void => {
        if (!pending) setImmediate(flush);
        pending += `${JSON.stringify(line)}\n`;
      };
      void edge
        .createSandboxes(req.body.sandboxes, {
          accepted: () => write({ accepted: req.body.sandboxes.length }),
          outcome: (index: number, outcome: EdgeCreateOutcome) => write({ index, ...outcome }),
        })
        .catch((err: unknown) => req.log.error({ err }, 'group create failed'))
        .finally(() => {
          flush();
          lines.end();
        });
      return reply;
    },
  );
  app.post(
    `${P}/fn/run`,
    { config: access.cluster, schema: { body: EdgeFnRequest, response: { 200: FnRunResult, ...errors } } },
    async (req, reply) => {
      if (!edge.runFn) throw new ApiError('BACKEND_UNSUPPORTED', 'this edge runs no function calls', { backend: 'fncall' });
      const hangup = abortOnHangup(reply);
      try {
        return await edge.runFn(req.body, hangup.signal);
      } finally {
        hangup.done();
      }
    },
  );
  app.delete(S, { config: access.cluster, schema: { params: Id, response: { 204: Type.Null(), ...errors } } }, async (req, reply) => {
    await edge.killSandbox(req.params.id);
    return reply.status(204).send(null);
  });

  app.post(
    `${S}/exec`,
    { config: access.cluster, schema: { params: Id, body: ExecRequest, response: { 200: ExecResult, ...errors } } },
    async (req, reply) => {
      const hangup = abortOnHangup(reply);
      if ((req.headers.accept ?? '').includes(NDJSON)) {
        const events = edge.execStream(req.params.id, req.body, hangup.signal);
        const lines = async function* (): AsyncGenerator<string> {
          yield `${JSON.stringify({ type: 'start' })}\n`;
          try {
            for await (const ev of events) yield eventToLine(ev);
          } catch (err) {
            const e = err instanceof ApiError ? err : new ApiError('EXEC_FAILED', (err as Error).message);
            yield `${JSON.stringify({ type: 'error', error: { code: e.code, message: e.message, details: e.details } })}\n`;
          } finally {
            hangup.done();
          }
        };
        return reply.type(NDJSON).send(Readable.from(lines()) as never);
      }
      try {
        return await edge.exec(req.params.id, req.body, hangup.signal);
      } finally {
        hangup.done();
      }
    },
  );

  // --- processes ---
  app.post(
    `${S}/processes`,
    { config: access.cluster, schema: { params: Id, body: StartProcessRequest, response: { 201: ProcessInfo, ...errors } } },
    async (req, reply) => reply.status(201).send(await edge.startProcess(req.params.id, req.body)),
  );
  app.get(`${S}/processes`, { config: access.cluster, schema: { params: Id, response: { 200: ProcessList, ...errors } } }, async (req) => ({
    processes: await edge.listProcesses(req.params.id),
  }));
  app.get(
    `${S}/processes/:pid`,
    {
      config: access.cluster,
      schema: {
        params: IdPid,
        querystring: Type.Object({
          stdout: Type.Integer({ minimum: 0, default: 0 }),
          stderr: Type.Integer({ minimum: 0, default: 0 }),
          encoding: Type.Union([Type.Literal('utf8'), Type.Literal('base64')], { default: 'utf8' }),
        }),
        response: { 200: ProcessOutput, ...errors },
      },
    },
    async (req) =>
      edge.processOutput(req.params.id, req.params.pid, { stdout: req.query.stdout, stderr: req.query.stderr }, req.query.encoding),
  );
  app.post(
    `${S}/processes/:pid/wait`,
    {
      config: access.cluster,
      schema: { params: IdPid, body: Type.Object({ timeoutMs: Type.Integer({ minimum: 0 }) }), response: { 200: ProcessInfo, ...errors } },
    },
    async (req) => edge.waitProcess(req.params.id, req.params.pid, req.body.timeoutMs),
  );
  app.post(
    `${S}/processes/:pid/signal`,
    { config: access.cluster, schema: { params: IdPid, body: SignalRequest, response: { 200: ProcessInfo, ...errors } } },
    async (req) => edge.signalProcess(req.params.id, req.params.pid, req.body.signal),
  );
  app.post(
    `${S}/processes/:pid/stdin`,
    {
      config: access.cluster,
      schema: {
        params: IdPid,
        querystring: Type.Object({ eof: Type.Boolean({ default: false }) }),
        response: { 204: Type.Null(), ...errors },
      },
    },
    async (req, reply) => {
      await edge.writeProcessStdin(req.params.id, req.params.pid, Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0), req.query.eof);
      return reply.status(204).send(null);
    },
  );

  // --- sessions ---
  app.post(
    `${S}/sessions`,
    { config: access.cluster, schema: { params: Id, body: OpenSessionRequest, response: { 201: SessionInfo, ...errors } } },
    async (req, reply) => reply.status(201).send(await edge.openSession(req.params.id, req.body)),
  );
  app.get(`${S}/sessions`, { config: access.cluster, schema: { params: Id, response: { 200: SessionList, ...errors } } }, async (req) => ({
    sessions: await edge.listSessions(req.params.id),
  }));
  app.post(
    `${S}/sessions/:sid/exec`,
    {
      config: access.cluster,
      schema: {
        params: IdSid,
        body: SessionExecRequest,
        response: { 200: Type.Intersect([ExecResult, Type.Object({ sessionAlive: Type.Boolean() })]), ...errors },
      },
    },
    async (req, reply) => {
      const hangup = abortOnHangup(reply);
      try {
        return await edge.sessionExec(req.params.id, req.params.sid, req.body, hangup.signal);
      } finally {
        hangup.done();
      }
    },
  );
  app.delete(
    `${S}/sessions/:sid`,
    { config: access.cluster, schema: { params: IdSid, response: { 204: Type.Null(), ...errors } } },
    async (req, reply) => {
      await edge.closeSession(req.params.id, req.params.sid);
      return reply.status(204).send(null);
    },
  );

  // --- state ---
  app.get(`${S}/usage`, { config: access.cluster, schema: { params: Id, response: { 200: EdgeUsage, ...errors } } }, async (req) =>
    edge.sandboxUsage(req.params.id),
  );
  app.post(
    `${S}/pause`,
    { config: access.cluster, schema: { params: Id, response: { 204: Type.Null(), ...errors } } },
    async (req, reply) => {
      await edge.pauseSandbox(req.params.id);
      return reply.status(204).send(null);
    },
  );
  app.post(
    `${S}/resume`,
    { config: access.cluster, schema: { params: Id, response: { 204: Type.Null(), ...errors } } },
    async (req, reply) => {
      await edge.resumeSandbox(req.params.id);
      return reply.status(204).send(null);
    },
  );
  app.post(
    `${S}/quiesce`,
    { config: access.cluster, schema: { params: Id, body: EdgeQuiesceRequest, response: { 200: EdgeQuiesce, ...errors } } },
    async (req) => edge.quiesceSandbox(req.params.id, req.body),
  );
  app.put(
    `${S}/network`,
    { config: access.cluster, schema: { params: Id, body: EdgeNetworkRequest, response: { 200: EdgeNetworkState, ...errors } } },
    async (req) => edge.setNetwork(req.params.id, req.body),
  );
  app.get(`${S}/network`, { config: access.cluster, schema: { params: Id, response: { 200: EdgeNetworkState, ...errors } } }, async (req) =>
    edge.getNetwork(req.params.id),
  );
  app.post(
    `${S}/snapshot`,
    { config: access.cluster, schema: { params: Id, body: EdgeSnapshotRequest, response: { 200: EdgeSnapshot, ...errors } } },
    async (req, reply) => {
      const hangup = abortOnHangup(reply);
      try {
        return await edge.snapshotSandbox(req.params.id, {
          ...(req.body.scrub ? { scrub: req.body.scrub } : {}),
          ...(req.body.memory ? { memory: true } : {}),
          ...(req.body.portable ? { portable: true } : {}),
          signal: hangup.signal,
        });
      } finally {
        hangup.done();
      }
    },
  );

  await app.register(fileRoutes(edge));
  await app.register(channelRoutes(edge));

  // --- volumes ---
  const VolumeName = Type.Object({ name: Type.String({ pattern: '^[a-z0-9][a-z0-9._-]{0,62}$' }) });
  app.put(
    `${P}/volumes/:name`,
    { config: access.cluster, schema: { params: VolumeName, response: { 204: Type.Null(), ...errors } } },
    async (req, reply) => {
      await edge.createVolume(req.params.name);
      return reply.status(204).send(null);
    },
  );
  app.delete(
    `${P}/volumes/:name`,
    { config: access.cluster, schema: { params: VolumeName, response: { 204: Type.Null(), ...errors } } },
    async (req, reply) => {
      await edge.deleteVolume(req.params.name);
      return reply.status(204).send(null);
    },
  );
  app.get(
    `${P}/volumes/:name/usage`,
    { config: access.cluster, schema: { params: VolumeName, response: { 200: EdgeVolumeUsage, ...errors } } },
    async (req) => edge.volumeUsage(req.params.name),
  );

  app.get(`${P}/openapi.json`, { config: access.cluster, schema: { hide: true } }, async () => app.swagger());
  await app.ready();
  return app as unknown as App;
}
