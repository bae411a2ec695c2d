import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { CreateSandboxRequest, NetworkPolicyRequest, SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { access } from '../../http/access.js';
import type { ControlPlane } from '../control-plane.js';
import type { StateStore } from '../state-store.js';
import { ENVD_VERSION, LABEL, newAccessToken } from './sandbox-access.js';

/**
 * A sandbox's timeout when the create request names none: five minutes, the default E2B's
 * documentation gives (SDK 2.x sends no timeout of its own when the caller gives none).
 */
const DEFAULT_TIMEOUT_S = 300;
const MAX_TIMEOUT_S = 30 * 86400;
const PAGE_MAX = 100;

/** An error as E2B's API sends it: `{code: <HTTP status>, message}`. */
class E2bHttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

function send(reply: FastifyReply, err: unknown): FastifyReply {
  if (err instanceof E2bHttpError) return reply.status(err.status).send({ code: err.status, message: err.message });
  if (err instanceof ApiError) {
    // A quota's refusal keeps dsec's code beside E2B's shape, so callers can tell which quota.
    if (err.code.startsWith('QUOTA_'))
      return reply.status(err.status).send({ code: err.status, message: err.message, error: { code: err.code, details: err.details } });
    return reply.status(err.status).send({ code: err.status, message: err.message });
  }
  return reply.status(500).send({ code: 500, message: (err as Error).message });
}

type Body = Record<string, unknown>;

function obj(v: unknown, what: string): Body {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new E2bHttpError(400, `${what} must be a JSON object`);
  return v as Body;
}

function stringMap(v: unknown, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(obj(v, what))) {
    if (typeof val !== 'string') throw new E2bHttpError(400, `${what}.${k} must be a string`);
    out[k] = val;
  }
  return out;
}

function timeoutOf(v: unknown, field = 'timeout'): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > MAX_TIMEOUT_S)
    throw new E2bHttpError(400, `${field} must be whole seconds from 0 to ${MAX_TIMEOUT_S}`);
  return v;
}

/** E2B's network options in terms of dsec's egress policies (see docs/E2B.md). */
function networkOf(body: Body): NetworkPolicyRequest | undefined {
  const net = obj(body['network'], 'network');
  const allowOut = net['allowOut'] ?? [];
  const denyOut = net['denyOut'] ?? [];
  if (!Array.isArray(allowOut) || !allowOut.every((a) => typeof a === 'string'))
    throw new E2bHttpError(400, 'network.allowOut must be a list of CIDRs or addresses');
  if (!Array.isArray(denyOut) || !denyOut.every((a) => typeof a === 'string'))
    throw new E2bHttpError(400, 'network.denyOut must be a list of CIDRs or addresses');
  for (const k of ['maskRequestHost', 'egressProxy', 'rules'])
    if (net[k] !== undefined) throw new E2bHttpError(400, `network.${k} is not supported by dsec (see docs/E2B.md)`);
  const denyAll = body['allow_internet_access'] === false || (denyOut as string[]).includes('0.0.0.0/0');
  if ((denyOut as string[]).some((d) => d !== '0.0.0.0/0'))
    throw new E2bHttpError(400, 'network.denyOut supports only 0.0.0.0/0 on dsec (deny all, then allowOut); dsec policies are allow-lists');
  if (allowOut.length > 0) return { mode: 'allow', allow: allowOut as string[] };
  if (denyAll) return { mode: 'none' };
  if (body['allow_internet_access'] === true) return { mode: 'open' };
  return undefined; // dsec's default: loopback only
}

/**
 * A sandbox made through the E2B API, with its envd access token: read from the store's own column
 * for it (never a label, which every key of the project lists), and given only in E2B's answers to
 * a key that sees the sandbox, as E2B's API gives it.
 */
type E2bSandbox = SandboxInfo & { accessToken: string };

function metadataOf(s: SandboxInfo): Record<string, string> {
  try {
    return JSON.parse(s.labels[LABEL.metadata] ?? '{}') as Record<string, string>;
  } catch {
    return {};
  }
}

function endAt(s: SandboxInfo): string {
  return s.expiresAt ?? new Date(Date.parse(s.createdAt) + MAX_TIMEOUT_S * 1000).toISOString();
}

/** The `Sandbox` answer of create, connect and resume. */
function created(s: E2bSandbox): Body {
  return {
    templateID: s.labels[LABEL.template] ?? s.image,
    sandboxID: s.id,
    alias: s.labels[LABEL.template] ?? s.image,
    clientID: s.edge,
    envdVersion: ENVD_VERSION,
    envdAccessToken: s.accessToken,
    trafficAccessToken: null,
    domain: null,
  };
}

/** `SandboxDetail` / `ListedSandbox`: every field E2B's API marks required. */
function detail(s: E2bSandbox): Body {
  return {
    templateID: s.labels[LABEL.template] ?? s.image,
    alias: s.labels[LABEL.template] ?? s.image,
    sandboxID: s.id,
    clientID: s.edge,
    startedAt: s.createdAt,
    endAt: endAt(s),
    cpuCount: Math.max(1, Math.ceil(s.resources.cpu)),
    memoryMB: s.resources.memoryMiB,
    diskSizeMB: s.resources.diskMiB ?? 0,
    metadata: metadataOf(s),
    state: s.status === 'paused' ? 'paused' : 'running',
    envdVersion: ENVD_VERSION,
    envdAccessToken: s.accessToken,
    domain: null,
  };
}

/** The metadata filter: `k=v&k2=v2`, each side URI-encoded once more by the SDK. */
function metadataFilter(q: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (typeof q !== 'string' || q === '') return out;
  for (const [k, v] of new URLSearchParams(q)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      out[k] = v;
    }
  }
  return out;
}

const UNSUPPORTED: [string, string, string][] = [
  ['GET', '/sandboxes/metrics', 'sandbox metrics'],
  ['GET', '/sandboxes/:id/metrics', 'sandbox metrics'],
  ['GET', '/sandboxes/:id/logs', 'sandbox logs'],
  ['GET', '/v2/sandboxes/:id/logs', 'sandbox logs'],
  [
    'PUT',
    '/sandboxes/:id/network',
    'changing the network of a running sandbox through the E2B API (use dsec PUT /v1/sandboxes/{id}/network)',
  ],
  ['POST', '/sandboxes/:id/snapshots', 'snapshots through the E2B API (use dsec POST /v1/sandboxes/{id}/snapshot)'],
  ['GET', '/snapshots', 'snapshots through the E2B API'],
  ['POST', '/sandboxes/:id/fork', 'fork through the E2B API (use dsec POST /v1/sandboxes/{id}/fork)'],
  ['GET', '/templates', 'templates (dsec images are built with `dsec image build`)'],
  ['POST', '/templates', 'template builds (build a dsec image with `dsec image build`)'],
  ['POST', '/v2/templates', 'template builds (build a dsec image with `dsec image build`)'],
  ['POST', '/v3/templates', 'template builds (build a dsec image with `dsec image build`)'],
  ['GET', '/templates/:id', 'templates (dsec images are built with `dsec image build`)'],
  ['DELETE', '/templates/:id', 'deleting templates'],
];

/**
 * E2B's control-plane REST API (create, connect/resume, kill, info, list with metadata filters
 * and pagination, timeout, pause) on dsec's control plane. Authenticated by an API key in
 * `X-API-KEY` (dsec mints `e2b_` keys for it); a sandbox made here is an ordinary dsec sandbox
 * with E2B's facts in its labels.
 */
export function registerControlRoutes(
  app: FastifyInstance,
  deps: { control: ControlPlane; store: StateStore; onKill: (id: string) => void },
): void {
  const { control } = deps;

  // Every route here takes an API key (X-API-KEY, as E2B's SDK sends it, or Authorization),
  // checked by the access hook (http/access.ts); its refusals leave in E2B's shape.
  app.setErrorHandler((err, _req, reply) => {
    if (err instanceof ApiError && err.code === 'UNAUTHORIZED')
      return send(reply, new E2bHttpError(401, 'missing, unknown or revoked API key: send X-API-KEY (mint one with `dsec e2b-key`)'));
    return send(reply, err);
  });

  /**
   * An E2B sandbox the caller may see: its project's (any, for an admin key), running or paused,
   * and made through this API. Another project's answers as a missing one does.
   */
  const find = async (req: FastifyRequest): Promise<E2bSandbox> => {
    const id = (req.params as { id: string }).id;
    let s: SandboxInfo;
    let accessToken: string | undefined;
    try {
      // Another project's sandbox is, for this caller, one that does not exist (the service decides).
      s = await control.sandboxes.get(req.caller, id);
      accessToken = await control.sandboxes.accessToken(req.caller, id);
    } catch {
      throw new E2bHttpError(404, `sandbox ${id} not found`);
    }
    if (accessToken === undefined || (s.status !== 'running' && s.status !== 'paused'))
      throw new E2bHttpError(404, `sandbox ${id} not found${s.reason ? ` (${s.reason})` : ''}`);
    return { ...s, accessToken };
  };

  const opts = { config: access.key, schema: { hide: true } };

  const create = async (req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> => {
    try {
      const body = obj(req.body, 'body');
      const template = body['templateID'];
      if (typeof template !== 'string' || template === '')
        throw new E2bHttpError(400, 'templateID is required (the name of a dsec image, e.g. "base")');
      for (const k of ['mcp', 'volumeMounts', 'autoResume', 'iam', 'autoPauseMemory']) {
        const v = body[k];
        if (v !== undefined && v !== null && !(Array.isArray(v) && v.length === 0))
          throw new E2bHttpError(400, `${k} is not supported by dsec (see docs/E2B.md)`);
      }
      if (body['secure'] === false)
        throw new E2bHttpError(400, 'secure: false is not supported: dsec always gives a sandbox an access token');
      const timeout = timeoutOf(body['timeout']) ?? DEFAULT_TIMEOUT_S;
      const metadata = stringMap(body['metadata'], 'metadata');
      const env = stringMap(body['envVars'], 'envVars');
      for (const k of Object.keys(env))
        if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new E2bHttpError(400, `envVars: ${JSON.stringify(k)} is not a valid variable name`);
      const network = networkOf(body);
      const spec: CreateSandboxRequest = {
        image: template,
        env,
        ttlSeconds: Math.max(1, timeout),
        onExpiry: body['autoPause'] === true ? 'pause' : 'stop',
        labels: { [LABEL.template]: template, [LABEL.metadata]: JSON.stringify(metadata) },
        ...(network ? { network } : {}),
      };
      const accessToken = newAccessToken();
      let s: SandboxInfo;
      try {
        s = await control.sandboxes.create(req.caller, spec, {}, { accessToken });
      } catch (err) {
        if (err instanceof ApiError && err.code === 'IMAGE_NOT_FOUND') {
          const hint =
            template === 'base'
              ? 'build it with `dsec image build e2b-base`'
              : 'build or import a dsec image with that name (`dsec image ls` lists them)';
          throw new E2bHttpError(404, `template ${JSON.stringify(template)} not found: ${hint}`);
        }
        throw err;
      }
      return reply.status(201).send(created({ ...s, accessToken }));
    } catch (err) {
      return send(reply, err);
    }
  };
  app.post('/sandboxes', opts, create);
  app.post('/v2/sandboxes', opts, create);

  const list = async (req: FastifyRequest, v2: boolean): Promise<E2bSandbox[]> => {
    const q = (req.query ?? {}) as Record<string, unknown>;
    const meta = metadataFilter(q['metadata']);
    const states = typeof q['state'] === 'string' ? q['state'].split(',').filter(Boolean) : v2 ? ['running', 'paused'] : ['running'];
    for (const st of states)
      if (st !== 'running' && st !== 'paused') throw new E2bHttpError(400, `state ${JSON.stringify(st)} is not running or paused`);
    const template = typeof q['template'] === 'string' && q['template'] ? q['template'] : undefined;
    const startedAfter = typeof q['startedAfter'] === 'string' ? Date.parse(q['startedAfter']) : undefined;
    const tokens = await control.sandboxes.accessTokens(req.caller);
    return (await control.sandboxes.list(req.caller, {}))
      .flatMap((s) => {
        const accessToken = tokens.get(s.id);
        return accessToken === undefined ? [] : [{ ...s, accessToken }];
      })
      .filter((s) => states.includes(s.status))
      .filter((s) => !template || s.labels[LABEL.template] === template)
      .filter((s) => startedAfter === undefined || Number.isNaN(startedAfter) || Date.parse(s.createdAt) > startedAfter)
      .filter((s) => {
        const m = metadataOf(s);
        return Object.entries(meta).every(([k, v]) => m[k] === v);
      })
      .sort((a, b) => (q['order'] === 'desc' ? -1 : 1) * (a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id)));
  };

  app.get('/sandboxes', opts, async (req, reply) => {
    try {
      return reply.send((await list(req, false)).map(detail));
    } catch (err) {
      return send(reply, err);
    }
  });

  app.get('/v2/sandboxes', opts, async (req, reply) => {
    try {
      const q = (req.query ?? {}) as Record<string, unknown>;
      const limit = q['limit'] === undefined ? PAGE_MAX : Number(q['limit']);
      if (!Number.isInteger(limit) || limit < 1 || limit > PAGE_MAX) throw new E2bHttpError(400, `limit must be 1 to ${PAGE_MAX}`);
      let offset = 0;
      if (typeof q['nextToken'] === 'string' && q['nextToken']) {
        offset = Number(Buffer.from(q['nextToken'], 'base64url').toString('utf8'));
        if (!Number.isInteger(offset) || offset < 0) throw new E2bHttpError(400, 'nextToken is not one this server gave');
      }
      const all = await list(req, true);
      const page = all.slice(offset, offset + limit);
      if (offset + limit < all.length) void reply.header('x-next-token', Buffer.from(String(offset + limit)).toString('base64url'));
      return reply.send(page.map(detail));
    } catch (err) {
      return send(reply, err);
    }
  });

  app.get('/sandboxes/:id', opts, async (req, reply) => {
    try {
      return reply.send(detail(await find(req)));
    } catch (err) {
      return send(reply, err);
    }
  });

  app.delete('/sandboxes/:id', opts, async (req, reply) => {
    try {
      const s = await find(req);
      await control.sandboxes.kill(req.caller, s.id);
      deps.onKill(s.id);
      return reply.status(204).send();
    } catch (err) {
      return send(reply, err);
    }
  });

  app.post('/sandboxes/:id/timeout', opts, async (req, reply) => {
    try {
      const s = await find(req);
      const t = timeoutOf(obj(req.body, 'body')['timeout']);
      if (t === undefined) throw new E2bHttpError(400, 'timeout (seconds) is required');
      await control.sandboxes.setExpiry(req.caller, s.id, Date.now() + Math.max(1, t) * 1000);
      return reply.status(204).send();
    } catch (err) {
      return send(reply, err);
    }
  });

  app.post('/sandboxes/:id/refreshes', opts, async (req, reply) => {
    try {
      const s = await find(req);
      const d = timeoutOf(obj(req.body, 'body')['duration'], 'duration') ?? DEFAULT_TIMEOUT_S;
      const until = Date.now() + d * 1000;
      if (!s.expiresAt || Date.parse(s.expiresAt) < until) await control.sandboxes.setExpiry(req.caller, s.id, until);
      return reply.status(204).send();
    } catch (err) {
      return send(reply, err);
    }
  });

  app.post('/sandboxes/:id/pause', opts, async (req, reply) => {
    try {
      const s = await find(req);
      if (s.status === 'paused') throw new E2bHttpError(409, `sandbox ${s.id} is already paused`);
      await control.sandboxes.pause(req.caller, s.id);
      // A paused E2B sandbox waits to be resumed; it does not run out while paused.
      await control.sandboxes.setExpiry(req.caller, s.id, Date.now() + MAX_TIMEOUT_S * 1000);
      return reply.status(204).send();
    } catch (err) {
      return send(reply, err);
    }
  });

  /** Resumes a paused sandbox; either way, the sandbox then lives at least `timeout` more seconds. */
  const connect =
    (mustBePaused: boolean) =>
    async (req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> => {
      try {
        const s = await find(req);
        const t = timeoutOf(obj(req.body, 'body')['timeout']) ?? DEFAULT_TIMEOUT_S;
        const wasPaused = s.status === 'paused';
        if (mustBePaused && !wasPaused) throw new E2bHttpError(409, `sandbox ${s.id} is already running`);
        const until = Date.now() + Math.max(1, t) * 1000;
        // Before resuming: a pause-on-timeout sandbox whose old expiry passed would be paused again.
        if (wasPaused || !s.expiresAt || Date.parse(s.expiresAt) < until) await control.sandboxes.setExpiry(req.caller, s.id, until);
        if (wasPaused) await control.sandboxes.resume(req.caller, s.id);
        return reply
          .status(wasPaused ? 201 : 200)
          .send(created({ ...(await control.sandboxes.get(req.caller, s.id)), accessToken: s.accessToken }));
      } catch (err) {
        return send(reply, err);
      }
    };
  app.post('/sandboxes/:id/connect', opts, connect(false));
  app.post('/v2/sandboxes/:id/connect', opts, connect(false));
  app.post('/sandboxes/:id/resume', opts, connect(true));

  for (const [method, url, what] of UNSUPPORTED) {
    app.route({
      method: method as 'GET',
      url,
      ...opts,
      handler: async (_req, reply) =>
        reply.status(501).send({ code: 501, message: `${what} is not supported by dsec's E2B API (see docs/E2B.md)` }),
    });
  }
}
