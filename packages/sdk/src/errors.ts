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
  /** A file call acting as a user of the sandbox was refused by the kernel (EACCES, EPERM); the message names the path and the uid. */
  FILE_PERMISSION_DENIED: 403,
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
  /**
   * The sandbox cannot move (POST …/migrate) as it is: a container running processes (migrate
   * between steps, or pass restartProcesses), volumes on its edge, a backend that does not move.
   */
  SANDBOX_NOT_MIGRATABLE: 409,
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
  /** Nothing accepted connections on the port within the wait's timeoutMs (POST …/port-waits). */
  PORT_WAIT_TIMEOUT: 504,
  CAPACITY_EXCEEDED: 503,
  /**
   * The node's disk under its data dir is full (or below the edge's --min-free-disk-mib for a
   * create): nothing was made; free space on the node (sandboxes, snapshots, images) and retry.
   */
  NODE_DISK_FULL: 507,
  /**
   * The command ran (`details.ran`, `details.exitCode`), but its result's JSON is more than the
   * control plane's output budget has room for (control bytes go as \u00XX, 6 bytes each): not
   * retryable as it is, since running it again runs it again; ask for encoding base64 or stream.
   */
  RESULT_TOO_LARGE: 507,
  /**
   * The node is short of memory (below the edge's --min-available-memory-mib, or thrashing past its
   * --max-memory-pressure) and took no new sandbox: nothing was made; retry later or elsewhere.
   */
  NODE_MEMORY_PRESSURE: 503,
  /**
   * A buffered result (exec, session exec, fn call) with maxOutputBytes above the default reserves
   * its worst case of the control plane's output budget; this one did not fit (the project's half,
   * or the whole). Nothing ran: stream the output, lower maxOutputBytes, or retry.
   */
  OUTPUT_BUDGET_EXCEEDED: 503,
  EDGE_UNAVAILABLE: 503,
  /** The sandbox is moving to another edge (`details.retryable`): the same call succeeds once it has moved. */
  SANDBOX_MIGRATING: 503,
  SANDBOX_CREATE_FAILED: 500,
  /** A move failed part way; the sandbox runs on where it was (`details.edge`), as before the call. */
  SANDBOX_MIGRATE_FAILED: 500,
  SANDBOX_KILL_FAILED: 500,
  EXEC_FAILED: 500,
  INTERNAL: 500,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export function statusForCode(code: ErrorCode): number {
  return ERROR_CODES[code];
}

/**
 * Root of every error the SDK throws. A server error's class is chosen by its `code`
 * (ERROR_CLASSES); `retryable` says whether the same call may succeed later.
 *
 * @example
 * try {
 *   await Sandbox.create({ image: 'busybox' });
 * } catch (err) {
 *   if (!(err instanceof DsecError && err.retryable)) throw err; // capacity, unavailable, rate limit: retry later
 * }
 */
export class DsecError extends Error {
  override readonly name: string = 'DsecError';
  /** True when the same call may succeed later unchanged: capacity, an unavailable node, a rate limit. */
  readonly retryable: boolean = false;
  constructor(
    message: string,
    /** The registry code (`SANDBOX_NOT_FOUND`, …), or the SDK's own (`TIMEOUT`, `UNREACHABLE`, `HTTP_<status>`, …). */
    readonly code: string,
    /** The HTTP status; undefined when no answer came (or the error arrived inside a stream). */
    readonly status: number | undefined,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** The sandbox, image, file, session, process, volume, … does not exist (any more). */
export class NotFoundError extends DsecError {
  override readonly name = 'NotFoundError';
}
/**
 * The API key is missing, wrong, or not allowed to do this (or a registry refused its credentials, or
 * the sandbox's kernel refused a file call made as one of its users: FILE_PERMISSION_DENIED).
 */
export class AuthError extends DsecError {
  override readonly name = 'AuthError';
}
/** The target is in the wrong state (paused, not running, session closed, path or name taken). */
export class ConflictError extends DsecError {
  override readonly name = 'ConflictError';
}
/** The request is malformed or too large; `details.field` names the field when there is one. */
export class InvalidRequestError extends DsecError {
  override readonly name = 'InvalidRequestError';
}
/**
 * No room right now (CAPACITY_EXCEEDED, NODE_MEMORY_PRESSURE: on the nodes; OUTPUT_BUDGET_EXCEEDED:
 * in the control plane's budget of buffered output): retry later, or ask for less.
 */
export class CapacityError extends DsecError {
  override readonly name = 'CapacityError';
  override readonly retryable = true;
}
/** A node or registry the call needs is unreachable for now (EDGE_UNAVAILABLE, REGISTRY_UNAVAILABLE): retry later. */
export class UnavailableError extends DsecError {
  override readonly name = 'UnavailableError';
  override readonly retryable = true;
}
/** The server failed (create, kill or exec failed, a port's server, a full disk, an internal error); `message` says why. */
export class ServerError extends DsecError {
  override readonly name = 'ServerError';
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

/** The server could not be reached, or the connection broke mid-call (`UNREACHABLE`, `STREAM_BROKEN`). */
export class UnreachableError extends DsecError {
  override readonly name = 'UnreachableError';
}

/** No server configured (`NOT_CONFIGURED`): pass `{ url, apiKey }`, set DSEC_URL and DSEC_API_KEY, or run `dsec up`. */
export class NotConfiguredError extends DsecError {
  override readonly name = 'NotConfiguredError';
}

/**
 * A project quota refused the call: `code` says which (QUOTA_SANDBOXES_EXCEEDED, QUOTA_CPU_EXCEEDED,
 * QUOTA_MEMORY_EXCEEDED: 403, wait for sandboxes to end or ask for a larger quota), and
 * `details` carries `quota`, `limit`, `used` and `requested`.
 */
export class QuotaError extends DsecError {
  override readonly name: string = 'QuotaError';
}

/**
 * The project's creates-per-second quota (QUOTA_CREATE_RATE_EXCEEDED, 429): retry after
 * `details.retryAfterMs`. A QuotaError too, so callers that catch QuotaError still see it.
 */
export class RateLimitError extends QuotaError {
  override readonly name = 'RateLimitError';
  override readonly retryable = true;
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

/** A class an error code maps to. */
export type DsecErrorClass = new (
  message: string,
  code: string,
  status: number | undefined,
  details?: Record<string, unknown>,
) => DsecError;

/**
 * The class each registry code maps to: callers catch what they act on. `satisfies` makes a code
 * added to ERROR_CODES without a class here a compile error; python/dsec/errors.py's CODE_CLASSES
 * holds the same table (its unit tests compare the two).
 */
export const ERROR_CLASSES = {
  INVALID_REQUEST: InvalidRequestError,
  BACKEND_UNSUPPORTED: InvalidRequestError,
  PAYLOAD_TOO_LARGE: InvalidRequestError,
  UNSUPPORTED_MEDIA_TYPE: InvalidRequestError,
  RANGE_NOT_SATISFIABLE: InvalidRequestError,
  UNAUTHORIZED: AuthError,
  FORBIDDEN: AuthError,
  REGISTRY_AUTH_FAILED: AuthError,
  FILE_PERMISSION_DENIED: AuthError,
  QUOTA_SANDBOXES_EXCEEDED: QuotaError,
  QUOTA_CPU_EXCEEDED: QuotaError,
  QUOTA_MEMORY_EXCEEDED: QuotaError,
  QUOTA_CREATE_RATE_EXCEEDED: RateLimitError,
  SANDBOX_NOT_FOUND: NotFoundError,
  IMAGE_NOT_FOUND: NotFoundError,
  FILE_NOT_FOUND: NotFoundError,
  ROUTE_NOT_FOUND: NotFoundError,
  SESSION_NOT_FOUND: NotFoundError,
  PROCESS_NOT_FOUND: NotFoundError,
  BLOB_NOT_FOUND: NotFoundError,
  EDGE_NOT_FOUND: NotFoundError,
  BATCH_NOT_FOUND: NotFoundError,
  VOLUME_NOT_FOUND: NotFoundError,
  POOL_NOT_FOUND: NotFoundError,
  PROJECT_NOT_FOUND: NotFoundError,
  KEY_NOT_FOUND: NotFoundError,
  POOL_EXISTS: ConflictError,
  SESSION_CLOSED: ConflictError,
  PROCESS_NOT_RUNNING: ConflictError,
  SANDBOX_NOT_RUNNING: ConflictError,
  SANDBOX_NOT_MIGRATABLE: ConflictError,
  PATH_CONFLICT: ConflictError,
  EDGE_NOT_EMPTY: ConflictError,
  PROJECT_EXISTS: ConflictError,
  IMAGE_NAME_TAKEN: ConflictError,
  VOLUME_EXISTS: ConflictError,
  VOLUME_IN_USE: ConflictError,
  CAPACITY_EXCEEDED: CapacityError,
  NODE_MEMORY_PRESSURE: CapacityError,
  OUTPUT_BUDGET_EXCEEDED: CapacityError,
  EDGE_UNAVAILABLE: UnavailableError,
  SANDBOX_MIGRATING: UnavailableError,
  REGISTRY_UNAVAILABLE: UnavailableError,
  PORT_NOT_LISTENING: ServerError,
  PORT_BAD_RESPONSE: ServerError,
  PORT_WAIT_TIMEOUT: TimeoutError,
  NODE_DISK_FULL: ServerError,
  RESULT_TOO_LARGE: ServerError,
  SANDBOX_CREATE_FAILED: ServerError,
  SANDBOX_KILL_FAILED: ServerError,
  SANDBOX_MIGRATE_FAILED: ServerError,
  EXEC_FAILED: ServerError,
  INTERNAL: ServerError,
} as const satisfies Record<ErrorCode, DsecErrorClass>;

/** The class for a code this SDK does not know yet (a newer server's), by the answer's HTTP status. */
function classForStatus(status: number | undefined): DsecErrorClass {
  switch (status) {
    case 400:
    case 413:
    case 415:
    case 416:
      return InvalidRequestError;
    case 401:
    case 403:
      return AuthError;
    case 404:
      return NotFoundError;
    case 409:
      return ConflictError;
    case 429:
      return RateLimitError;
    case 503:
      return CapacityError;
    default:
      return status !== undefined && status >= 500 ? ServerError : DsecError;
  }
}

/**
 * Maps a wire error `{code, message, details}` to the class callers act on. The code decides; a
 * code this SDK does not know (or a body that is no wire error, e.g. a proxy's) falls back to the
 * HTTP status, so a proxy's 503 is still a retryable CapacityError. `status` is undefined for an
 * error that arrived inside a stream (a batch's failed item, a terminal's error frame).
 */
export function errorFromWire(
  status: number | undefined,
  body: { code?: string; message?: string; details?: Record<string, unknown> } | undefined,
): DsecError {
  const code = typeof body?.code === 'string' ? body.code : `HTTP_${status}`;
  const message = typeof body?.message === 'string' ? body.message : `HTTP ${status}`;
  const details = body?.details !== null && typeof body?.details === 'object' ? body.details : {};
  const cls = Object.hasOwn(ERROR_CLASSES, code) ? ERROR_CLASSES[code as ErrorCode] : classForStatus(status);
  return new cls(message, code, status, details);
}
