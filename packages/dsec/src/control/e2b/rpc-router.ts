import { PassThrough } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteShorthandOptions } from 'fastify';
import { ApiError } from '../../api-error.js';
import {
  CONNECT_CODES,
  ConnectError,
  endStreamEnvelope,
  messageEnvelope,
  parseJson,
  parseTimeoutMs,
  STREAM_JSON,
  streamRequestMessage,
  toConnectError,
  UNARY_JSON,
} from './connect-protocol.js';
import type { Caller } from '../service/callers.js';

/** Bytes of a server stream waiting for its client at most (serveStream cuts a client that leaves more unread). */
export const MAX_UNREAD_BYTES = 16 << 20;
/** Why a call's signal fired: the client went away, or its Connect-Timeout-Ms passed. */
export type AbortReason = 'hangup' | 'deadline';

/** The sandbox a sandbox-side call acts in, and the caller its access token makes (service/callers.ts). */
export interface SandboxSide {
  sandboxId: string;
  caller: Caller;
}

export interface CallContext extends SandboxSide {
  /** The user named by `Authorization: Basic`, if any (the service applies the default). */
  user: string | undefined;
  signal: AbortSignal;
  /** When the call's Connect-Timeout-Ms runs out (epoch ms), if it has one. */
  deadlineAt?: number;
}

export type Message = Record<string, unknown>;
export type UnaryHandler = (ctx: CallContext, req: Message) => Promise<Message>;
export type StreamHandler = (ctx: CallContext, req: Message, emit: (msg: Message) => void) => Promise<void>;

export interface RpcService {
  /** Fully qualified name, e.g. `process.Process`. */
  name: string;
  unary: Record<string, UnaryHandler>;
  stream: Record<string, StreamHandler>;
  /** The message a stream sends when it has been idle for the keep-alive interval. */
  keepalive: Message;
}

/** Seconds between keep-alives when the client names none (E2B's SDK asks for 50). */
const DEFAULT_KEEPALIVE_S = 50;

/** dsec's errors as Connect codes; a gone sandbox is `unavailable`, as E2B's proxy reports it. */
export function connectErrorOf(err: unknown): ConnectError {
  if (err instanceof ApiError) {
    switch (err.code) {
      case 'SANDBOX_NOT_FOUND':
      case 'SANDBOX_NOT_RUNNING':
        return new ConnectError('unavailable', err.message);
      case 'FILE_NOT_FOUND':
      case 'PROCESS_NOT_FOUND':
      case 'SESSION_NOT_FOUND':
        return new ConnectError('not_found', err.message);
      case 'PATH_CONFLICT':
        return new ConnectError('already_exists', err.message);
      case 'INVALID_REQUEST':
      case 'PAYLOAD_TOO_LARGE':
      case 'PROCESS_NOT_RUNNING':
        return new ConnectError('invalid_argument', err.message);
      case 'FORBIDDEN':
      case 'FILE_PERMISSION_DENIED':
        return new ConnectError('permission_denied', err.message);
      case 'UNAUTHORIZED':
        return new ConnectError('unauthenticated', err.message);
      case 'CAPACITY_EXCEEDED':
        return new ConnectError('resource_exhausted', err.message);
      default:
        return new ConnectError('internal', err.message);
    }
  }
  return toConnectError(err);
}

/** HTTP status of a unary error; a gone sandbox answers 502 like E2B's proxy. */
function unaryStatus(e: ConnectError): number {
  return e.code === 'unavailable' ? 502 : CONNECT_CODES[e.code];
}

/**
 * Serves Connect unary and server-streaming calls for the given services at
 * `POST <prefix>/<service>/<Method>`. Request bodies arrive as raw buffers.
 */
export function registerRpc(
  app: FastifyInstance,
  prefix: string,
  services: RpcService[],
  routeOptions: RouteShorthandOptions,
  context: (req: FastifyRequest) => Promise<{ sandboxId: string; caller: Caller; user: string | undefined }>,
  gone: SandboxGone,
): void {
  const byName = new Map(services.map((s) => [s.name, s]));
  app.post(`${prefix}/:service/:method`, routeOptions, async (req, reply) => {
    const { service: sName, method } = req.params as { service: string; method: string };
    const service = byName.get(sName);
    const unary = service?.unary[method];
    const stream = service?.stream[method];
    const contentType = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    if (stream) {
      if (contentType !== STREAM_JSON)
        return sendUnaryError(
          reply,
          new ConnectError('invalid_argument', `${sName}/${method} is server-streaming: send Content-Type: ${STREAM_JSON}`),
        );
      return serveStream(req, reply, service!, stream, body, context, gone);
    }
    if (!unary)
      return sendUnaryError(reply, new ConnectError('unimplemented', `dsec does not implement ${sName}/${method} (see docs/E2B.md)`));
    if (contentType !== UNARY_JSON)
      return sendUnaryError(
        reply,
        new ConnectError('invalid_argument', `send JSON (Content-Type: ${UNARY_JSON}); the binary protobuf codec is not supported`),
      );
    const ctrl = new AbortController();
    const onClose = (): void => {
      if (!reply.raw.writableFinished) ctrl.abort('hangup' satisfies AbortReason);
    };
    reply.raw.on('close', onClose);
    try {
      const msg = parseJson(body);
      if (typeof msg !== 'object' || msg === null || Array.isArray(msg))
        throw new ConnectError('invalid_argument', 'the request message must be a JSON object');
      const ctx = { ...(await context(req)), signal: ctrl.signal };
      const out = await unary(ctx, msg as Message);
      return reply.status(200).type(UNARY_JSON).send(JSON.stringify(out));
    } catch (err) {
      return sendUnaryError(reply, connectErrorOf(err));
    } finally {
      reply.raw.off('close', onClose);
    }
  });
}

export function sendUnaryError(reply: FastifyReply, e: ConnectError): FastifyReply {
  return reply
    .status(unaryStatus(e))
    .type(UNARY_JSON)
    .send(JSON.stringify({ code: e.code, message: e.message }));
}

async function serveStream(
  req: FastifyRequest,
  reply: FastifyReply,
  service: RpcService,
  handler: StreamHandler,
  body: Buffer,
  context: (req: FastifyRequest) => Promise<{ sandboxId: string; caller: Caller; user: string | undefined }>,
  gone: SandboxGone,
): Promise<FastifyReply> {
  const out = new PassThrough();
  const ctrl = new AbortController();
  let sandboxId: string | undefined;
  let timers: NodeJS.Timeout[] = [];
  let lastSent = Date.now();
  let ended = false;
  const emit = (msg: Message): void => {
    if (ended) return;
    lastSent = Date.now();
    out.write(messageEnvelope(msg));
    // What is pushed here (a PTY's or a process's output, a watch's events) does not wait for the
    // client: one that stops reading is cut off once MAX_UNREAD_BYTES wait for it, as if it had
    // hung up (its call is aborted), rather than this process holding its stream without end.
    if (out.readableLength + out.writableLength > MAX_UNREAD_BYTES) {
      ended = true;
      for (const t of timers) clearTimeout(t);
      timers = [];
      out.destroy();
      reply.raw.destroy(); // its close aborts the call ('hangup')
    }
  };
  const finish = (err?: ConnectError): void => {
    if (ended) return;
    ended = true;
    for (const t of timers) clearTimeout(t);
    timers = [];
    out.end(endStreamEnvelope(err));
  };
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) ctrl.abort('hangup' satisfies AbortReason);
  });
  // Errors of a stream travel in its end envelope; the HTTP status is 200 once the stream began.
  void reply.status(200).header('content-type', STREAM_JSON).send(out);
  try {
    const deadline = parseTimeoutMs(req.headers['connect-timeout-ms']);
    const deadlineAt = deadline !== undefined && deadline > 0 ? Date.now() + deadline : undefined;
    if (deadline !== undefined && deadline > 0) timers.push(setTimeout(() => ctrl.abort('deadline' satisfies AbortReason), deadline));
    // The JS SDK names the interval Keepalive-Ping-Interval; newer Python SDKs E2B-Keepalive-Ping.
    const ka = Number(req.headers['keepalive-ping-interval'] ?? req.headers['e2b-keepalive-ping'] ?? DEFAULT_KEEPALIVE_S);
    const kaMs = (Number.isFinite(ka) && ka > 0 ? ka : DEFAULT_KEEPALIVE_S) * 1000;
    const keepalive = setInterval(
      () => {
        if (Date.now() - lastSent >= kaMs) emit(service.keepalive);
      },
      Math.min(kaMs, 1000),
    );
    timers.push(keepalive);
    const msg = streamRequestMessage(body);
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg))
      throw new ConnectError('invalid_argument', 'the request message must be a JSON object');
    const ctx: CallContext = { ...(await context(req)), signal: ctrl.signal, ...(deadlineAt !== undefined ? { deadlineAt } : {}) };
    sandboxId = ctx.sandboxId;
    await handler(ctx, msg as Message, emit);
    if (ctrl.signal.aborted && ctrl.signal.reason === 'deadline')
      throw new ConnectError('deadline_exceeded', 'the call ran past its Connect-Timeout-Ms');
    finish();
  } catch (err) {
    const deadline = ctrl.signal.aborted && ctrl.signal.reason === 'deadline';
    if (!deadline && sandboxId !== undefined && sandboxWentAway(err) && (await gone(sandboxId))) {
      // The sandbox was killed (or paused) under a running stream. On E2B its VM, and the
      // connection with it, is simply gone: the SDK then probes /health and reports "the
      // sandbox was killed … while the request was in flight". Drop the connection the same way.
      ended = true;
      for (const t of timers) clearTimeout(t);
      timers = [];
      reply.raw.destroy();
      return reply;
    }
    finish(deadline ? new ConnectError('deadline_exceeded', 'the call ran past its Connect-Timeout-Ms') : connectErrorOf(err));
  }
  return reply;
}

/**
 * Whether a sandbox has stopped running, as the control plane records it, waiting a little for a
 * kill under way to be recorded (the node drops the sandbox before the store says so): a stream
 * is dropped only once /health, which E2B's SDK probes next, answers that the sandbox is gone.
 */
export type SandboxGone = (sandboxId: string) => Promise<boolean>;

/** An error that says the stream's sandbox stopped running while the stream was open. */
function sandboxWentAway(err: unknown): boolean {
  return err instanceof ApiError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'SANDBOX_NOT_RUNNING');
}
