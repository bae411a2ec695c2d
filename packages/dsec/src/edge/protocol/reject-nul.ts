import { ApiError } from '../../api-error.js';

/**
 * Refuses a NUL byte in anything that becomes a C string in the sandbox: the kernel ends an
 * argument or variable at the first NUL, so the command that ran would not be the one asked for
 * (and logged in the trajectory).
 */
export function rejectNul(what: string, values: string[]): void {
  if (values.some((v) => v.includes('\0'))) {
    throw new ApiError('INVALID_REQUEST', `${what} contains a NUL byte, which no command line or environment can hold; remove it`, {
      field: what,
    });
  }
}
