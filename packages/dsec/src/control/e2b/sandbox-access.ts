import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ControlPlane } from '../control-plane.js';
import { ConnectError } from './connect-protocol.js';

/** Labels the E2B layer keeps on a dsec sandbox. */
export const LABEL = {
  /** Marks a sandbox made through the E2B API; its value is the template the caller named. */
  template: 'e2b.template',
  /** The sandbox's envd access token (the SDK sends it as X-Access-Token). */
  accessToken: 'e2b.access-token',
  /** The caller's metadata, as JSON (E2B keys are free-form; dsec label keys are not). */
  metadata: 'e2b.metadata',
} as const;

/** The envd version dsec speaks for; the SDK turns features on and off by it (see docs/E2B.md). */
export const ENVD_VERSION = '0.5.7';

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

/**
 * The sandbox a sandbox-side request names with `E2b-Sandbox-Id`, checked the way E2B's envd
 * checks callers: the sandbox's access token in `X-Access-Token` (or, for /files, a signature made
 * with it). A sandbox that is gone, or not one made through the E2B API, answers `unavailable`
 * (HTTP 502), as E2B's proxy does.
 */
export async function sandboxFor(
  control: ControlPlane,
  headers: Record<string, string | string[] | undefined>,
  signed?: { path: string; operation: 'read' | 'write'; user: string; signature: string; expiration?: number },
): Promise<SandboxInfo> {
  const id = headers['e2b-sandbox-id'];
  if (typeof id !== 'string' || id === '') throw new ConnectError('invalid_argument', 'E2b-Sandbox-Id header is missing');
  let s: SandboxInfo;
  try {
    s = await control.get(id);
  } catch (err) {
    if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND') throw new ConnectError('unavailable', `sandbox ${id} not found`);
    throw err;
  }
  const token = s.labels[LABEL.accessToken];
  if (token === undefined) throw new ConnectError('unavailable', `sandbox ${id} was not created through the E2B API`);
  if (s.status !== 'running')
    throw new ConnectError(
      'unavailable',
      `sandbox ${id} is ${s.status}${s.status === 'paused' ? ': connect to it (Sandbox.connect) to resume it' : ''}`,
    );
  const given = headers['x-access-token'];
  if (typeof given === 'string' && sameSecret(given, token)) return s;
  if (signed) {
    if (signed.expiration !== undefined && signed.expiration * 1000 < Date.now())
      throw new ConnectError('unauthenticated', 'the signed URL has expired');
    if (sameSecret(signed.signature, fileSignature(signed.path, signed.operation, signed.user, token, signed.expiration))) return s;
    throw new ConnectError('unauthenticated', 'the file URL signature does not match');
  }
  throw new ConnectError(
    'unauthenticated',
    'missing or wrong X-Access-Token for this sandbox (use the envdAccessToken the create or connect response gave)',
  );
}
