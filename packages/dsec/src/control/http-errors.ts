import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../api-error.js';

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

/** Every failure leaves as `{error:{code,message,details}}` with the registry's status. */
export function errorHandler(err: FastifyError | ApiError | Error, req: FastifyRequest, reply: FastifyReply): void {
  if (err instanceof ApiError) {
    if (err.status >= 500) req.log.error({ err }, 'request failed');
    void reply.status(err.status).send({ error: { code: err.code, message: err.message, details: err.details } });
    return;
  }
  const fe = err as FastifyError & { validation?: ValidationIssue[]; validationContext?: string };
  if (fe.validation && fe.validation.length > 0) {
    const issue = fe.validation[0]!;
    const field = fieldOf(issue);
    const where = fe.validationContext ?? 'request';
    const what = issue.params?.['additionalProperty'] ? 'is not a known field' : (issue.message ?? 'is invalid');
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
    void reply.status(413).send({ error: { code: 'PAYLOAD_TOO_LARGE', message: `request body is over the limit for this route`, details: {} } });
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
  req.log.error({ err }, 'unhandled error');
  void reply.status(500).send({ error: { code: 'INTERNAL', message: `internal error: ${err.message}`, details: {} } });
}
