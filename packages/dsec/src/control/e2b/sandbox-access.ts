import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { SYSTEM, sandboxTokenCaller } from '../service/callers.js';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import type { FastifyRequest } from 'fastify';
import { ConnectError } from './connect-protocol.js';
import { SANDBOX_PREFIX } from './sandbox-prefix.js';

/** Labels the E2B layer keeps on a dsec sandbox. */
export const LABEL = {
  /** Marks a sandbox made through the E2B API; its value is the template the caller named. */
  template: 'e2b.template',
  /** The caller's metadata, as JSON (E2B keys are free-form; dsec label keys are not). */
  metadata: 'e2b.metadata',
} as const;

/** The envd version dsec speaks for; the SDK turns features on and off by it (see docs/E2B.md). */
export const ENVD_VERSION = '0.6.4';

export function newAccessToken(): string {
  return randomBytes(24).toString('hex');
}

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** `v1_` + unpadded base64 sha256 of `path:operation:user:token[:expiration]`: E2B's signed file URLs. */
export function fileSignature(path: string, operation: 'read' | 'write', user: string, token: string, expiration?: number): string {
  const raw = expiration === undefined ? `${path}:${operation}:${user}:${token}` : `${path}:${operation}:${user}:${token}:${expiration}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/** What a sandbox-side request presents instead of an API key. */
interface EnvdCredentials {
  token: string | undefined;
  signed?: { path: string; operation: 'read' | 'write'; user: string; signature: string; expiration?: number };
  /** Set by sandboxFor when the signature, not the token, admitted the request. */
  bySignature?: boolean;
}

const NO_TOKEN = 'send the sandbox access token as X-Access-Token (the envdAccessToken the create or connect response gave)';

/**
 * The sandbox a sandbox-side request names with `E2b-Sandbox-Id`, checked the way E2B's envd
 * checks callers: the sandbox's access token in `X-Access-Token` (or, for /files, a signature made
 * with it). No token at all is `unauthenticated` (401), decided before any lookup. A token that
 * does not open the named sandbox answers exactly as a sandbox that is not there, or not running,
 * does (`unavailable`, HTTP 502, as E2B's proxy says it): an unknown id, one not made through the
 * E2B API and a wrong token or signature are one answer, so the answer tells a caller without the
 * token nothing of which sandboxes exist, and E2B's SDK still reports a killed sandbox as gone.
 */
export async function sandboxFor(control: ControlPlane, id: string | undefined, creds: EnvdCredentials): Promise<SandboxInfo> {
  if ((id === undefined || id === '') && creds.signed) id = await signedSandbox(control, creds.signed);
  if (id === undefined || id === '') throw new ConnectError('invalid_argument', 'E2b-Sandbox-Id header is missing');
  if (creds.token === undefined && !creds.signed) throw new ConnectError('unauthenticated', NO_TOKEN);
  const gone = new ConnectError('unavailable', `no running sandbox ${id} answers this access token`);
  let s: SandboxInfo;
  try {
    s = await control.sandboxes.get(SYSTEM, id); // the token, checked below, decides
  } catch (err) {
    if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND') throw gone;
    throw err;
  }
  // Its own column in the store, never a label (store/sandboxes.ts accessToken).
  const token = await control.sandboxes.accessToken(SYSTEM, id);
  if (token === undefined) throw gone;
  const signed = creds.signed;
  if (!(creds.token !== undefined && sameSecret(creds.token, token))) {
    if (!signed || !sameSecret(signed.signature, fileSignature(signed.path, signed.operation, signed.user, token, signed.expiration)))
      throw gone;
    if (signed.expiration !== undefined && signed.expiration * 1000 < Date.now())
      throw new ConnectError('unauthenticated', 'the signed URL has expired');
    creds.bySignature = true;
  }
  if (s.status !== 'running')
    throw new ConnectError(
      'unavailable',
      `sandbox ${id} is ${s.status}${s.status === 'paused' ? ': connect to it (Sandbox.connect) to resume it' : ''}`,
    );
  return s;
}

/**
 * The sandbox whose access token made a signed URL that came without `E2b-Sandbox-Id` (E2B puts
 * the id in the URL's host, `49983-<id>.<domain>`; with E2B_SANDBOX_URL pointing at dsec the URL
 * has one host for every sandbox). Every E2B sandbox's token is tried: one sha256 each, about a
 * microsecond, so thousands of sandboxes cost milliseconds.
 */
async function signedSandbox(control: ControlPlane, signed: NonNullable<EnvdCredentials['signed']>): Promise<string> {
  // Running sandboxes only: a signed URL opens nothing else, and the work stays bounded by what runs.
  for (const [id, token] of await control.sandboxes.accessTokens(SYSTEM, true)) {
    if (sameSecret(signed.signature, fileSignature(signed.path, signed.operation, signed.user, token, signed.expiration))) return id;
  }
  // Without an id there is nothing to learn about which sandboxes exist: say what is wrong, as envd does.
  throw new ConnectError('unauthenticated', 'the signature does not match: the URL was altered, or made with another access token');
}

/** A non-empty string query parameter, else undefined (envd's routes and their access check read them alike). */
export function queryString(q: unknown, key: string): string | undefined {
  const v = (q as Record<string, unknown> | undefined)?.[key];
  return typeof v === 'string' && v !== '' ? v : undefined;
}

/** The credentials of a sandbox-side request: its token, and for /files a signed URL's parameters. */
function credentialsOf(req: FastifyRequest): EnvdCredentials {
  const token = req.headers['x-access-token'];
  const creds: EnvdCredentials = { token: typeof token === 'string' ? token : undefined };
  const signature = queryString(req.query, 'signature');
  if (signature && req.routeOptions.url === `${SANDBOX_PREFIX}/files` && (req.method === 'GET' || req.method === 'POST')) {
    const exp = queryString(req.query, 'signature_expiration');
    creds.signed = {
      path: queryString(req.query, 'path') ?? '',
      operation: req.method === 'GET' ? 'read' : 'write',
      user: queryString(req.query, 'username') ?? '',
      signature,
      ...(exp ? { expiration: Number(exp) } : {}),
    };
  }
  return creds;
}

const admitted = new WeakMap<FastifyRequest, SandboxInfo>();
/** Requests admitted by a signed URL, not the token: the path it was signed for (empty: any, as E2B's). */
const signedPaths = new WeakMap<FastifyRequest, string>();

/**
 * The access check of `sandboxToken` routes (http/access.ts): the sandbox a request names and its
 * access token (or signed URL), checked before any handler runs; the handler reads the sandbox
 * with `admittedSandbox`.
 */
export function e2bSandboxGate(control: ControlPlane): (req: FastifyRequest) => Promise<void> {
  return async (req) => {
    const id = req.headers['e2b-sandbox-id'];
    const creds = credentialsOf(req);
    admitted.set(req, await sandboxFor(control, typeof id === 'string' ? id : undefined, creds));
    if (creds.bySignature && creds.signed) signedPaths.set(req, creds.signed.path);
  };
}

/**
 * The path a signed URL admitted this request for, when the signature (not the token) let it in:
 * such a request may touch that path only, whatever else its body names. Undefined for the token's
 * holder, and '' for a URL signed without a path (E2B's uploads named by their form's file names).
 */
export function signedPathOf(req: FastifyRequest): string | undefined {
  return signedPaths.get(req);
}

/** The sandbox the access hook admitted this request to, and the caller its token makes. */
export function admittedSide(req: FastifyRequest): SandboxSide {
  const s = admittedSandbox(req);
  return { sandboxId: s.id, caller: sandboxTokenCaller(s) };
}

/** The sandbox the access hook admitted this request to. */
export function admittedSandbox(req: FastifyRequest): SandboxInfo {
  const s = admitted.get(req);
  if (!s) throw new ConnectError('unauthenticated', NO_TOKEN);
  return s;
}
