import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { MAX_FILE_BYTES } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import { FREE_SPACE_HINT, isDiskFull } from '../host/disk-space.js';

/** JSON bodies carry at most an 8 MiB stdin (base64 makes it larger); files travel as raw bytes up to MAX_FILE_BYTES. */
export const JSON_BODY_LIMIT = 16 << 20;

interface ValidationIssue {
  instancePath?: string;
  message?: string;
  params?: Record<string, unknown>;
}

/** `/resources/memoryMiB` + context `body` → `resources.memoryMiB`; additionalProperty names the unknown key. */
function fieldOf(issue: ValidationIssue): string {
  let path = (issue.instancePath ?? '').replace(/^\//, '').replace(/\//g, '.');
  const extra = issue.params?.['additionalProperty'] ?? issue.params?.['missingProperty'];
  if (typeof extra === 'string') path = path ? `${path}.${extra}` : extra;
  return path;
}

/** 5xx codes that report what the sandbox's own programs do, logged without a stack trace. */
const SANDBOX_STATE_CODES = new Set<string>(['PORT_NOT_LISTENING', 'PORT_BAD_RESPONSE', 'PORT_WAIT_TIMEOUT']);

/** Codes that mean no room right now: logged as one line, not an error report. */
const NO_ROOM_CODES: ReadonlySet<string> = new Set([
  'CAPACITY_EXCEEDED',
  'NODE_MEMORY_PRESSURE',
  'OUTPUT_BUDGET_EXCEEDED',
  'RESULT_TOO_LARGE',
]);

/** Every failure leaves as `{error:{code,message,details}}` with the registry's status. */
export function errorHandler(err: FastifyError | ApiError | Error, req: FastifyRequest, reply: FastifyReply): void {
  // A call that failed before its body was read to the end (an upload meeting a full disk, a
  // limit) leaves the rest of that body on the connection: the client must not send its next
  // request there, where it would wait behind bytes nobody reads.
  if (!req.raw.complete) void reply.header('connection', 'close');
  // A full disk anywhere below a route (a snapshot's mkfs.erofs, an import's blob, an upload, the
  // SQLite store) is the node's state, not a bug: 507 with what to free, never a bare 500.
  const api = err instanceof ApiError ? err : undefined;
  if ((!api || (api.status >= 500 && api.code !== 'NODE_DISK_FULL')) && isDiskFull(err)) {
    req.log.warn({ err }, 'the disk is full');
    void reply.status(507).send({
      error: {
        code: 'NODE_DISK_FULL',
        message: `the node's disk is full: ${err.message}; ${FREE_SPACE_HINT}`,
        details: api?.details ?? {},
      },
    });
    return;
  }
  if (err instanceof ApiError) {
    // A port nothing listens on (or a server there that answered badly) is the sandbox's state,
    // not dsec's fault: one line without a stack, not an error report.
    if (SANDBOX_STATE_CODES.has(err.code)) req.log.info({ code: err.code, msg: err.message }, 'request refused');
    // No room now (nodes full, an output budget spent) is load, not a fault, and cheap to ask for
    // again and again: one line without a stack.
    else if (NO_ROOM_CODES.has(err.code)) req.log.warn({ code: err.code, msg: err.message }, 'request refused: no room');
    else if (err.status >= 500) req.log.error({ err }, 'request failed');
    void reply.status(err.status).send({ error: { code: err.code, message: err.message, details: err.details } });
    return;
  }
  const fe = err as FastifyError & { validation?: ValidationIssue[]; validationContext?: string };
  if (fe.validation && fe.validation.length > 0) {
    const issue = fe.validation[0]!;
    const field = fieldOf(issue);
    const where = fe.validationContext ?? 'request';
    if (where === 'params' && field === 'id') {
      // A sandbox id that cannot exist: 404 when it is made of id characters (a typo, an id of
      // the wrong length), 400 when it could never be one. Neither quotes the id pattern.
      const id = String((req.params as Record<string, unknown> | undefined)?.['id'] ?? '');
      if (/^[a-z0-9-]{1,80}$/.test(id)) {
        void reply
          .status(404)
          .send({ error: { code: 'SANDBOX_NOT_FOUND', message: `no sandbox ${id}; list sandboxes with \`dsec ps\``, details: { id } } });
        return;
      }
      void reply.status(400).send({
        error: {
          code: 'INVALID_REQUEST',
          message: 'params.id is not a sandbox id: ids look like sb-<edge>-<lower-case letters and digits>, as `dsec ps` lists them',
          details: { field: 'id', in: 'params' },
        },
      });
      return;
    }
    let what = issue.params?.['additionalProperty'] ? 'is not a known field' : (issue.message ?? 'is invalid');
    // A union of literals fails once per literal ("must be equal to constant"): name them all.
    const allowed = fe.validation
      .filter((i) => i.instancePath === issue.instancePath && i.params?.['allowedValue'] !== undefined)
      .map((i) => i.params!['allowedValue']);
    if (allowed.length > 0) what = `must be one of ${allowed.map((a) => JSON.stringify(a)).join(', ')}`;
    void reply.status(400).send({
      error: {
        code: 'INVALID_REQUEST',
        message: `${where}${field ? `.${field}` : ''} ${what}`,
        details: { field: field || undefined, in: where, issues: fe.validation.slice(0, 5) },
      },
    });
    return;
  }
  if (fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    const raw = (req.headers['content-type'] ?? '').startsWith('application/octet-stream');
    const limit = raw ? MAX_FILE_BYTES : JSON_BODY_LIMIT;
    const hint = raw
      ? ' (a file: send larger trees as a tar upload, PUT …/files/tar, up to 1 GiB)'
      : ' (a JSON body: stdin over 8 MiB belongs to a background process)';
    void reply.status(413).send({
      error: {
        code: 'PAYLOAD_TOO_LARGE',
        message: `request body is over the ${limit >> 20} MiB limit for this route${hint}`,
        details: { limit },
      },
    });
    return;
  }
  if (fe.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
    void reply.status(415).send({ error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: fe.message, details: {} } });
    return;
  }
  if (fe.statusCode !== undefined && fe.statusCode >= 400 && fe.statusCode < 500) {
    void reply.status(fe.statusCode).send({ error: { code: 'INVALID_REQUEST', message: fe.message, details: { cause: fe.code } } });
    return;
  }
  if (err instanceof RangeError && /Invalid string length/.test(err.message) && reply.statusCode < 300) {
    // An answer past V8's longest string (~512 MiB of JSON: output of control bytes, each sent as
    // \u00XX) cannot be serialised; the budgets' checks should refuse it first (output-budget.ts).
    req.log.warn({ msg: err.message }, 'an answer too large to serialise');
    void reply.status(507).send({
      error: {
        code: 'RESULT_TOO_LARGE',
        message:
          'the answer is too large to send as JSON (past the longest string this server can make); what it asked for may have run: ask for encoding base64, a smaller maxOutputBytes, fewer steps, or stream',
        details: { retryable: false },
      },
    });
    return;
  }
  req.log.error({ err }, 'unhandled error');
  void reply.status(500).send({ error: { code: 'INTERNAL', message: `internal error: ${err.message}`, details: {} } });
}
