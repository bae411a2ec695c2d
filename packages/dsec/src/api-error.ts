import { type ErrorCode, statusForCode } from '@dsec/sdk';

/**
 * An error meant for the API caller: a registry code, a message that says what to fix, and
 * details (a tool's stderr, the offending field). Edge and control plane throw it; the HTTP
 * layer turns it into `{error:{code,message,details}}` with the code's status.
 */
export class ApiError extends Error {
  override readonly name = 'ApiError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
  get status(): number {
    return statusForCode(this.code);
  }
}
