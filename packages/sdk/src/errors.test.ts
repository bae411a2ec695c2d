import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  AuthError,
  CommandExitError,
  ConflictError,
  DsecError,
  ERROR_CODES,
  InvalidRequestError,
  NotFoundError,
  QuotaError,
  RateLimitError,
  TimeoutError,
  errorFromWire,
  statusForCode,
  type ErrorCode,
} from './errors.js';

describe('errorFromWire', () => {
  const cases: [number, string, new (...a: never[]) => DsecError][] = [
    [401, 'UNAUTHORIZED', AuthError],
    [403, 'FORBIDDEN', AuthError],
    [404, 'SANDBOX_NOT_FOUND', NotFoundError],
    [404, 'FILE_NOT_FOUND', NotFoundError],
    [409, 'SANDBOX_NOT_RUNNING', ConflictError],
    [400, 'INVALID_REQUEST', InvalidRequestError],
    [413, 'PAYLOAD_TOO_LARGE', InvalidRequestError],
    [415, 'UNSUPPORTED_MEDIA_TYPE', InvalidRequestError],
  ];
  for (const [status, code, cls] of cases) {
    test(`${status} ${code} → ${cls.name}`, () => {
      const err = errorFromWire(status, { code, message: 'm', details: { a: 1 } });
      assert.ok(err instanceof cls);
      assert.ok(err instanceof DsecError);
      assert.ok(err instanceof Error);
      assert.equal(err.name, cls.name);
      assert.equal(err.code, code);
      assert.equal(err.status, status);
      assert.equal(err.message, 'm');
      assert.deepEqual(err.details, { a: 1 });
    });
  }

  test('5xx and 503 → plain DsecError with the code', () => {
    for (const [status, code] of [
      [500, 'INTERNAL'],
      [500, 'SANDBOX_CREATE_FAILED'],
      [503, 'CAPACITY_EXCEEDED'],
    ] as const) {
      const err = errorFromWire(status, { code, message: 'x' });
      assert.equal(err.constructor, DsecError);
      assert.equal(err.name, 'DsecError');
      assert.equal(err.code, code);
      assert.equal(err.status, status);
    }
  });

  test('a body without an error object gives HTTP_<status>, a generic message and empty details', () => {
    const err = errorFromWire(502, undefined);
    assert.equal(err.code, 'HTTP_502');
    assert.equal(err.message, 'HTTP 502');
    assert.deepEqual(err.details, {});
  });

  test('missing details become {}', () => {
    assert.deepEqual(errorFromWire(404, { code: 'X', message: 'y' }).details, {});
  });

  test('the class follows the status, even for an unknown code', () => {
    assert.ok(errorFromWire(404, { code: 'SOMETHING_NEW', message: 'n' }) instanceof NotFoundError);
  });
});

describe('error registry', () => {
  test('statusForCode answers the registry status for every code', () => {
    for (const [code, status] of Object.entries(ERROR_CODES)) assert.equal(statusForCode(code as ErrorCode), status);
  });

  test('every code maps back to the class its status implies', () => {
    for (const [code, status] of Object.entries(ERROR_CODES)) {
      const err = errorFromWire(status, { code, message: code });
      if (code === 'QUOTA_CREATE_RATE_EXCEEDED') assert.ok(err instanceof RateLimitError, code);
      else if (code.startsWith('QUOTA_')) assert.ok(err instanceof QuotaError && !(err instanceof RateLimitError), code);
      else if (status === 404) assert.ok(err instanceof NotFoundError, code);
      else if (status === 409) assert.ok(err instanceof ConflictError, code);
      else if (status === 401 || status === 403) assert.ok(err instanceof AuthError, code);
      else if (status === 400 || status === 413 || status === 415) assert.ok(err instanceof InvalidRequestError, code);
      else assert.equal(err.constructor, DsecError, code);
    }
  });

  test('statuses are HTTP error statuses', () => {
    for (const status of Object.values(ERROR_CODES)) assert.ok(status >= 400 && status <= 599);
  });
});

describe('quota errors', () => {
  test('a quota code maps to QuotaError by code, not to AuthError by its 403', () => {
    const err = errorFromWire(403, { code: 'QUOTA_CPU_EXCEEDED', message: 'm', details: { quota: 'maxCpu', limit: 2 } });
    assert.ok(err instanceof QuotaError);
    assert.ok(!(err instanceof AuthError));
    assert.equal(err.name, 'QuotaError');
    assert.deepEqual(err.details, { quota: 'maxCpu', limit: 2 });
  });

  test('the create-rate quota (429) is a RateLimitError, itself a QuotaError', () => {
    const err = errorFromWire(429, { code: 'QUOTA_CREATE_RATE_EXCEEDED', message: 'm', details: { retryAfterMs: 200 } });
    assert.ok(err instanceof RateLimitError);
    assert.ok(err instanceof QuotaError);
    assert.equal(err.status, 429);
  });
});

describe('CommandExitError', () => {
  test('carries exit code, stdout and stderr', () => {
    const err = new CommandExitError(3, 'out', 'err');
    assert.ok(err instanceof DsecError);
    assert.equal(err.name, 'CommandExitError');
    assert.equal(err.code, 'COMMAND_EXIT');
    assert.equal(err.exitCode, 3);
    assert.equal(err.stdout, 'out');
    assert.equal(err.stderr, 'err');
    assert.deepEqual(err.details, { exitCode: 3 });
    assert.match(err.message, /exited with code 3/);
  });
});

describe('TimeoutError', () => {
  test('is a DsecError named TimeoutError', () => {
    const err = new TimeoutError('t', 'TIMEOUT', undefined);
    assert.ok(err instanceof DsecError);
    assert.equal(err.name, 'TimeoutError');
  });
});
