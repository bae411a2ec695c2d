/**
 * One error-code registry for server and SDK. The server answers with `{error:{code,message,details}}`
 * and the HTTP status listed here; the SDK maps the code back to an error class.
 */
export const ERROR_CODES = {
  INVALID_REQUEST: 400,
  BACKEND_UNSUPPORTED: 400,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  REGISTRY_AUTH_FAILED: 403,
  /** The project already has as many live sandboxes (creating, running, paused) as its quota allows. */
  QUOTA_SANDBOXES_EXCEEDED: 403,
  /** The project's live sandboxes would together ask for more CPUs than its quota allows. */
  QUOTA_CPU_EXCEEDED: 403,
  /** The project's live sandboxes would together ask for more memory than its quota allows. */
  QUOTA_MEMORY_EXCEEDED: 403,
  /** The project creates sandboxes faster than its creates-per-second quota; retry after details.retryAfterMs. */
  QUOTA_CREATE_RATE_EXCEEDED: 429,
  SANDBOX_NOT_FOUND: 404,
  IMAGE_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  ROUTE_NOT_FOUND: 404,
  SESSION_NOT_FOUND: 404,
  PROCESS_NOT_FOUND: 404,
  BLOB_NOT_FOUND: 404,
  EDGE_NOT_FOUND: 404,
  BATCH_NOT_FOUND: 404,
  VOLUME_NOT_FOUND: 404,
  POOL_NOT_FOUND: 404,
  POOL_EXISTS: 409,
  PROJECT_NOT_FOUND: 404,
  KEY_NOT_FOUND: 404,
  SESSION_CLOSED: 409,
  PROCESS_NOT_RUNNING: 409,
  SANDBOX_NOT_RUNNING: 409,
  PATH_CONFLICT: 409,
  EDGE_NOT_EMPTY: 409,
  PROJECT_EXISTS: 409,
  /** The image name belongs to another project, or is a shared name only an admin key may move. */
  IMAGE_NAME_TAKEN: 409,
  VOLUME_EXISTS: 409,
  /** A volume that sandboxes still mount cannot be deleted (`details.sandboxes` names them). */
  VOLUME_IN_USE: 409,
  PAYLOAD_TOO_LARGE: 413,
  UNSUPPORTED_MEDIA_TYPE: 415,
  RANGE_NOT_SATISFIABLE: 416,
  REGISTRY_UNAVAILABLE: 503,
  /** Nothing accepts connections on that port in the sandbox (the proxy's upstream refused). */
  PORT_NOT_LISTENING: 502,
  /** The server on the port closed the connection or answered with something that is not HTTP. */
  PORT_BAD_RESPONSE: 502,
  CAPACITY_EXCEEDED: 503,
  /**
   * The node's disk under its data dir is full (or below the edge's --min-free-disk-mib for a
   * create): nothing was made; free space on the node (sandboxes, snapshots, images) and retry.
   */
  NODE_DISK_FULL: 507,
  /**
   * The node is short of memory (below the edge's --min-available-memory-mib, or thrashing past its
   * --max-memory-pressure) and took no new sandbox: nothing was made; retry later or elsewhere.
   */
  NODE_MEMORY_PRESSURE: 503,
  EDGE_UNAVAILABLE: 503,
  SANDBOX_CREATE_FAILED: 500,
  SANDBOX_KILL_FAILED: 500,
  EXEC_FAILED: 500,
  INTERNAL: 500,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export function statusForCode(code: ErrorCode): number {
  return ERROR_CODES[code];
}

/** Root of every error the SDK throws. */
export class DsecError extends Error {
  override readonly name: string = 'DsecError';
  constructor(
    message: string,
    readonly code: string,
    readonly status: number | undefined,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

export class NotFoundError extends DsecError {
  override readonly name = 'NotFoundError';
}
export class AuthError extends DsecError {
  override readonly name = 'AuthError';
}
export class ConflictError extends DsecError {
  override readonly name = 'ConflictError';
}
export class InvalidRequestError extends DsecError {
  override readonly name = 'InvalidRequestError';
}
/**
 * The call did not finish within its deadline (`code: 'TIMEOUT'`, `details.timeoutMs`), or the
 * caller's signal timed out (`code: 'ABORTED'`, e.g. AbortSignal.timeout()).
 */
export class TimeoutError extends DsecError {
  override readonly name = 'TimeoutError';
}

/** The caller's signal aborted the call (`signal.reason` is in the message). */
export class AbortedError extends DsecError {
  override readonly name = 'AbortedError';
}

/**
 * A project quota refused the call: `code` says which (QUOTA_SANDBOXES_EXCEEDED, QUOTA_CPU_EXCEEDED,
 * QUOTA_MEMORY_EXCEEDED: 403, wait for sandboxes to end or ask for a larger quota), and
 * `details` carries `quota`, `limit`, `used` and `requested`.
 */
export class QuotaError extends DsecError {
  override readonly name: string = 'QuotaError';
}

/** The project's creates-per-second quota (429): retry after `details.retryAfterMs`. */
export class RateLimitError extends QuotaError {
  override readonly name = 'RateLimitError';
}

/** Thrown by `commands.run(..., { throwOnError: true })` when a command exits non-zero. */
export class CommandExitError extends DsecError {
  override readonly name = 'CommandExitError';
  constructor(
    readonly exitCode: number,
    readonly stdout: string,
    readonly stderr: string,
  ) {
    super(`command exited with code ${exitCode}`, 'COMMAND_EXIT', undefined, { exitCode });
  }
}

/** Maps a wire error to the class callers act on. */
export function errorFromWire(
  status: number,
  body: { code?: string; message?: string; details?: Record<string, unknown> } | undefined,
): DsecError {
  const code = body?.code ?? `HTTP_${status}`;
  const message = body?.message ?? `HTTP ${status}`;
  const details = body?.details ?? {};
  // By code first: a quota's 403 or 429 is acted on differently from a missing key's 401/403.
  if (code === 'QUOTA_CREATE_RATE_EXCEEDED' || status === 429) return new RateLimitError(message, code, status, details);
  if (code.startsWith('QUOTA_')) return new QuotaError(message, code, status, details);
  if (status === 401 || status === 403) return new AuthError(message, code, status, details);
  if (status === 404) return new NotFoundError(message, code, status, details);
  if (status === 409) return new ConflictError(message, code, status, details);
  if (status === 400 || status === 413 || status === 415) return new InvalidRequestError(message, code, status, details);
  return new DsecError(message, code, status, details);
}
