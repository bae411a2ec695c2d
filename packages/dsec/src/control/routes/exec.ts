import { Readable } from 'node:stream';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import {
  ExecRequest,
  ExecResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessList,
  ProcessOutput,
  ProcessOutputQuery,
  ProcessParams,
  SandboxIdParams,
  SessionExecRequest,
  SessionInfo,
  SessionList,
  SessionParams,
  SignalRequest,
  StartProcessRequest,
  WaitProcessRequest,
} from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import type { ExecEvent } from '../../edge/protocol/exec-event.js';
import { abortOnHangup } from '../../http/abort-on-hangup.js';
import { releaseWhenSent } from '../../http/release-when-sent.js';
import { errorResponses as errors } from './error-responses.js';
import { access } from '../../http/access.js';

export const NDJSON = 'application/x-ndjson';

/** Commands: one-shot exec (JSON or an NDJSON stream), persistent sessions, background processes. */
export function execRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();

    app.post(
      '/v1/sandboxes/:id/exec',
      {
        config: access.key,
        schema: {
          tags: ['exec'],
          summary: `Run a command to completion; with Accept: ${NDJSON}, stream {type:stdout|stderr,data:base64} lines, then {type:exit,…}`,
          description: 'A client that disconnects before the answer is complete has its command killed (whole process tree).',
          params: SandboxIdParams,
          body: ExecRequest,
          response: { 200: ExecResult, ...errors },
        },
      },
      async (req, reply) => {
        const { id } = req.params;
        if ((req.headers.accept ?? '').includes(NDJSON)) {
          const hangup = abortOnHangup(reply);
          let events: AsyncGenerator<ExecEvent>;
          try {
            events = await control.exec.execStream(req.caller, id, req.body, hangup.signal); // 400/413/404/409 before the stream starts
          } catch (err) {
            hangup.done();
            throw err;
          }
          const lines = async function* (): AsyncGenerator<string> {
            // A first line right away: headers go out before the command writes anything.
            yield `${JSON.stringify({ type: 'start' })}\n`;
            try {
              for await (const ev of events) {
                yield ev.type === 'exit'
                  ? `${JSON.stringify({ type: 'exit', ...ev.result })}\n`
                  : `${JSON.stringify({ type: ev.type, data: ev.data.toString('base64') })}\n`;
              }
            } finally {
              hangup.done();
            }
          };
          return reply.type(NDJSON).send(Readable.from(lines()) as never);
        }
        const hangup = abortOnHangup(reply);
        try {
          return await control.exec.exec(req.caller, id, req.body, hangup.signal, (release) => releaseWhenSent(reply, release));
        } finally {
          hangup.done();
        }
      },
    );

    // --- sessions ----------------------------------------------------------------------------
    const sTags = ['sessions'];
    app.post(
      '/v1/sandboxes/:id/sessions',
      {
        config: access.key,
        schema: {
          tags: sTags,
          summary: 'Open a persistent shell session',
          params: SandboxIdParams,
          body: OpenSessionRequest,
          response: { 201: SessionInfo, ...errors },
        },
      },
      async (req, reply) => reply.status(201).send(await control.exec.openSession(req.caller, req.params.id, req.body)),
    );
    app.get(
      '/v1/sandboxes/:id/sessions',
      {
        config: access.key,
        schema: { tags: sTags, summary: 'List sessions', params: SandboxIdParams, response: { 200: SessionList, ...errors } },
      },
      async (req) => ({
        sessions: await control.exec.listSessions(req.caller, req.params.id),
      }),
    );
    app.post(
      '/v1/sandboxes/:id/sessions/:sid/exec',
      {
        config: access.key,
        schema: {
          tags: sTags,
          summary: 'Run a command in a session (cwd, env and variables persist); commands queue in order',
          params: SessionParams,
          body: SessionExecRequest,
          response: { 200: Type.Intersect([ExecResult, Type.Object({ sessionAlive: Type.Boolean() })]), ...errors },
        },
      },
      async (req, reply) => {
        const hangup = abortOnHangup(reply);
        try {
          return await control.exec.sessionExec(req.caller, req.params.id, req.params.sid, req.body, hangup.signal, (release) =>
            releaseWhenSent(reply, release),
          );
        } finally {
          hangup.done();
        }
      },
    );
    app.delete(
      '/v1/sandboxes/:id/sessions/:sid',
      {
        config: access.key,
        schema: { tags: sTags, summary: 'Close a session', params: SessionParams, response: { 204: Type.Null(), ...errors } },
      },
      async (req, reply) => {
        await control.exec.closeSession(req.caller, req.params.id, req.params.sid);
        return reply.status(204).send(null);
      },
    );

    // --- background processes ----------------------------------------------------------------
    const pTags = ['processes'];
    app.post(
      '/v1/sandboxes/:id/processes',
      {
        config: access.key,
        schema: {
          tags: pTags,
          summary: 'Start a background process',
          params: SandboxIdParams,
          body: StartProcessRequest,
          response: { 201: ProcessInfo, ...errors },
        },
      },
      async (req, reply) => reply.status(201).send(await control.exec.startProcess(req.caller, req.params.id, req.body)),
    );
    app.get(
      '/v1/sandboxes/:id/processes',
      {
        config: access.key,
        schema: { tags: pTags, summary: 'List background processes', params: SandboxIdParams, response: { 200: ProcessList, ...errors } },
      },
      async (req) => ({
        processes: await control.exec.listProcesses(req.caller, req.params.id),
      }),
    );
    app.get(
      '/v1/sandboxes/:id/processes/:pid',
      {
        config: access.key,
        schema: {
          tags: pTags,
          summary: 'A process and its output so far (from the given offsets)',
          params: ProcessParams,
          querystring: ProcessOutputQuery,
          response: { 200: ProcessOutput, ...errors },
        },
      },
      async (req, reply) =>
        control.exec.processOutput(
          req.caller,
          req.params.id,
          req.params.pid,
          { stdout: req.query.stdoutOffset ?? 0, stderr: req.query.stderrOffset ?? 0 },
          req.query.encoding ?? 'utf8',
          (release) => releaseWhenSent(reply, release),
        ),
    );
    app.post(
      '/v1/sandboxes/:id/processes/:pid/wait',
      {
        config: access.key,
        schema: {
          tags: pTags,
          summary: 'Wait for a process to exit (or timeoutMs)',
          params: ProcessParams,
          body: WaitProcessRequest,
          response: { 200: ProcessInfo, ...errors },
        },
      },
      async (req) => control.exec.waitProcess(req.caller, req.params.id, req.params.pid, req.body.timeoutMs ?? 30_000),
    );
    app.post(
      '/v1/sandboxes/:id/processes/:pid/signal',
      {
        config: access.key,
        schema: {
          tags: pTags,
          summary: 'Signal a process (SIGKILL: its whole tree)',
          params: ProcessParams,
          body: SignalRequest,
          response: { 200: ProcessInfo, ...errors },
        },
      },
      async (req) => control.exec.signalProcess(req.caller, req.params.id, req.params.pid, req.body.signal),
    );
    app.post(
      '/v1/sandboxes/:id/processes/:pid/stdin',
      {
        config: access.key,
        schema: {
          tags: pTags,
          summary: 'Write raw bytes (application/octet-stream) to a process started with stdin: true; ?eof=true closes it',
          params: ProcessParams,
          querystring: Type.Object({ eof: Type.Optional(Type.Boolean({ default: false })) }, { additionalProperties: false }),
          response: { 204: Type.Null(), ...errors },
        },
      },
      async (req, reply) => {
        const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
        await control.exec.writeProcessStdin(req.caller, req.params.id, req.params.pid, body, req.query.eof ?? false);
        return reply.status(204).send(null);
      },
    );
    app.delete(
      '/v1/sandboxes/:id/processes/:pid',
      {
        config: access.key,
        schema: { tags: pTags, summary: 'Kill a process and its tree', params: ProcessParams, response: { 200: ProcessInfo, ...errors } },
      },
      async (req) => control.exec.signalProcess(req.caller, req.params.id, req.params.pid, 'SIGKILL'),
    );
  };
}
