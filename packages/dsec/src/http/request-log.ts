import { AsyncLocalStorage } from 'node:async_hooks';
import type { IncomingMessage } from 'node:http';
import type { FastifyBaseLogger, FastifyInstance, FastifyRequest } from 'fastify';
import pino, { type DestinationStream, type Logger } from 'pino';
import { randomBits64 } from '../host/random-bits.js';

/** The header that carries a request's id, in both directions. */
export const REQUEST_ID_HEADER = 'x-request-id';

/** A caller's own id is kept when it is a plain token (it is logged and echoed, never parsed). */
const CALLER_ID = /^[A-Za-z0-9._:-]{1,64}$/;

interface RequestScope {
  reqId: string;
  /** Its number among the requests this process has taken in (requestArrivals). */
  arrival: number;
  /** Its response is sent (or the client went away): work it started and left running is no longer "serving it". */
  over?: boolean;
}

/** Each request's scope, to mark it over when its response is done (hooks that run outside it). */
const scopes = new WeakMap<object, RequestScope>();

/** Requests taken in by this process's servers so far (useRequestLog numbers each as it arrives). */
let arrivals = 0;

/**
 * The request being served, for log lines written by code that was handed no request logger:
 * the control plane, placement, an in-process edge. Set by the servers' onRequest hook.
 */
const scope = new AsyncLocalStorage<RequestScope>();

/**
 * Whether a logger binds reqId itself: the mixin leaves those alone, so no line has the key twice.
 * A request's logger is the server's own (requestIdOptions), so dsec's bind none; a child some
 * code makes with a reqId of its own would. Asked of a logger when it writes a line in a
 * request's scope, and kept.
 */
const bindsReqId = new WeakMap<object, boolean>();

function hasReqId(logger: object): boolean {
  let has = bindsReqId.get(logger);
  if (has === undefined) bindsReqId.set(logger, (has = (logger as Logger).bindings()['reqId'] !== undefined));
  return has;
}

/**
 * The process's one logger (pino: structured JSON lines, Fastify's own). Every line written while
 * a request is served carries that request's `reqId`, whichever component wrote it; components
 * add their own bindings with child loggers (`edge`, `sandbox`, `component`).
 */
export function createLogger(opts: { level: string; destination?: DestinationStream }): Logger {
  const options: pino.LoggerOptions = {
    level: opts.level,
    base: undefined,
    mixin: (_obj, _level, logger) => {
      const s = scope.getStore();
      return s && !hasReqId(logger) ? { reqId: s.reqId } : {};
    },
  };
  return opts.destination ? pino(options, opts.destination) : pino(options);
}

/** The id of the request being served here, if any (sent on to edges so their lines carry it too). */
export function currentRequestId(): string | undefined {
  return scope.getStore()?.reqId;
}

/**
 * The requests this process has taken in, numbered as they arrive, and the one being served: the
 * state store's SQLite feed lets a request's reads share a check for other connections' commits
 * made after it arrived (control/store/change-feed.ts, RequestArrivals).
 */
export const requestArrivals = {
  count: (): number => arrivals,
  current: (): number | undefined => {
    const s = scope.getStore();
    return s && !s.over ? s.arrival : undefined;
  },
};

/** The id of an incoming request: the caller's X-Request-Id when it is a plain token, else a new one. */
export function requestIdFor(req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER];
  if (typeof given === 'string' && CALLER_ID.test(given)) return given;
  return `req-${randomBits64().toString(16).padStart(16, '0')}`;
}

/**
 * Fastify options for request ids (ours, echoed in the response) and a request's logger: the
 * server's own, not a child of it binding reqId. The log scope that useRequestLog's onRequest
 * enters, before any other hook or handler runs, gives each line written in the request its reqId
 * (createLogger's mixin), as it does a component's. A pino child per request, its bindings
 * serialized as it is made, cost every request ~1 % of the control plane's CPU per create under
 * `dsec bench cluster`, and most requests write no line.
 */
export const requestIdOptions = {
  genReqId: requestIdFor,
  childLoggerFactory: (logger: FastifyBaseLogger): FastifyBaseLogger => logger,
};

type AnyFastify = FastifyInstance<any, any, any, any, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/**
 * Hooks for a server: every response says its request id (X-Request-Id), the rest of the request
 * runs in its log scope, and a request that names a sandbox (`:id` in the route) logs with the
 * sandbox and its edge bound (`sandbox`, `edge`).
 */
export function useRequestLog(app: AnyFastify, edgeOf: (sandboxId: string) => string | undefined): void {
  app.addHook('onRequest', (req: FastifyRequest, reply, done) => {
    void reply.header(REQUEST_ID_HEADER, req.id);
    const s: RequestScope = { reqId: req.id, arrival: ++arrivals };
    scopes.set(req, s);
    scope.run(s, done);
  });
  const over = (req: FastifyRequest, _reply: unknown, done: () => void): void => {
    const s = scopes.get(req);
    if (s) s.over = true;
    done();
  };
  app.addHook('onResponse', over);
  app.addHook('onRequestAbort', (req: FastifyRequest, done: () => void) => over(req, undefined, done));
  // Before validation, so a request refused for a bad body still logs with its sandbox.
  app.addHook('preValidation', (req: FastifyRequest, _reply, done) => {
    const id = sandboxIdOf(req);
    if (id) {
      const edge = edgeOf(id);
      req.log = req.log.child(edge ? { sandbox: id, edge } : { sandbox: id });
    }
    done();
  });
}

function sandboxIdOf(req: FastifyRequest): string | undefined {
  const params = req.params as Record<string, unknown> | undefined;
  const id = params?.['id'] ?? params?.['sandboxID'] ?? req.headers['e2b-sandbox-id'];
  return typeof id === 'string' && id.startsWith('sb-') ? id : undefined;
}
