import type { ExecEvent } from './exec-event.js';
import { ApiError } from '../../api-error.js';
import type { ErrorCode } from '@dsec/sdk';

/**
 * Exec streams on the wire, one JSON object per line: `{type:start}`, then `{type:stdout|stderr,
 * data:<base64>}` as output comes, then `{type:exit, …result}`; or `{type:error, error}` when the
 * command could not run. The public API and the edge protocol use the same lines.
 */
export function eventToLine(ev: ExecEvent): string {
  return ev.type === 'exit'
    ? `${JSON.stringify({ type: 'exit', ...ev.result })}\n`
    : `${JSON.stringify({ type: ev.type, data: ev.data.toString('base64') })}\n`;
}

/** The inverse of eventToLine; null for the start line. Throws the error a `{type:error}` line carries. */
export function lineToEvent(line: string): ExecEvent | null {
  const m = JSON.parse(line) as {
    type: string;
    data?: string;
    error?: { code: ErrorCode; message: string; details?: Record<string, unknown> };
  } & Record<string, unknown>;
  if (m.type === 'start') return null;
  if (m.type === 'stdout' || m.type === 'stderr') return { type: m.type, data: Buffer.from(m.data ?? '', 'base64') };
  if (m.type === 'exit') {
    const { type: _t, ...result } = m;
    return { type: 'exit', result: result as Extract<ExecEvent, { type: 'exit' }>['result'] };
  }
  if (m.type === 'error' && m.error) throw new ApiError(m.error.code, m.error.message, m.error.details ?? {});
  throw new ApiError('INTERNAL', `unexpected exec stream line ${line.slice(0, 200)}`);
}
