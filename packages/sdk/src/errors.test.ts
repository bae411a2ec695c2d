import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { Connection } from './connection.js';
import {
  AuthError,
  CapacityError,
  CommandExitError,
  ConflictError,
  DsecError,
  ERROR_CLASSES,
  ERROR_CODES,
  InvalidRequestError,
  NotFoundError,
  QuotaError,
  RateLimitError,
  ServerError,
  TimeoutError,
  UnavailableError,
  errorFromWire,
  statusForCode,
  type DsecErrorClass,
  type ErrorCode,
} from './errors.js';

/**
 * What each registry code must become, written out here rather than read from ERROR_CLASSES so
 * that a changed mapping shows up as a failing test (python/tests/test_units.py holds the same).
 */
const EXPECTED: [DsecErrorClass, ErrorCode[]][] = [
  [InvalidRequestError, ['INVALID_REQUEST', 'BACKEND_UNSUPPORTED', 'PAYLOAD_TOO_LARGE', 'UNSUPPORTED_MEDIA_TYPE', 'RANGE_NOT_SATISFIABLE']],
  [AuthError, ['UNAUTHORIZED', 'FORBIDDEN', 'REGISTRY_AUTH_FAILED', 'FILE_PERMISSION_DENIED']],
  [QuotaError, ['QUOTA_SANDBOXES_EXCEEDED', 'QUOTA_CPU_EXCEEDED', 'QUOTA_MEMORY_EXCEEDED']],
  [RateLimitError, ['QUOTA_CREATE_RATE_EXCEEDED']],
  [
    NotFoundError,
    [
      'SANDBOX_NOT_FOUND',
      'IMAGE_NOT_FOUND',
      'FILE_NOT_FOUND',
      'ROUTE_NOT_FOUND',
      'SESSION_NOT_FOUND',
      'PROCESS_NOT_FOUND',
      'BLOB_NOT_FOUND',
      'EDGE_NOT_FOUND',
      'BATCH_NOT_FOUND',
      'VOLUME_NOT_FOUND',
      'POOL_NOT_FOUND',
      'PROJECT_NOT_FOUND',
      'KEY_NOT_FOUND',
    ],
  ],
  [
    ConflictError,
    [
      'POOL_EXISTS',
      'SESSION_CLOSED',
      'PROCESS_NOT_RUNNING',
      'SANDBOX_NOT_RUNNING',
      'SANDBOX_NOT_MIGRATABLE',
      'PATH_CONFLICT',
      'EDGE_NOT_EMPTY',
      'PROJECT_EXISTS',
      'IMAGE_NAME_TAKEN',
      'VOLUME_EXISTS',
      'VOLUME_IN_USE',
    ],
  ],
  [CapacityError, ['CAPACITY_EXCEEDED', 'NODE_MEMORY_PRESSURE', 'OUTPUT_BUDGET_EXCEEDED']],
  [UnavailableError, ['EDGE_UNAVAILABLE', 'SANDBOX_MIGRATING', 'REGISTRY_UNAVAILABLE']],
  [TimeoutError, ['PORT_WAIT_TIMEOUT']],
  [
    ServerError,
    [
      'PORT_NOT_LISTENING',
      'PORT_BAD_RESPONSE',
      'NODE_DISK_FULL',
      'RESULT_TOO_LARGE',
      'SANDBOX_CREATE_FAILED',
      'SANDBOX_KILL_FAILED',
      'SANDBOX_MIGRATE_FAILED',
      'EXEC_FAILED',
      'INTERNAL',
    ],
  ],
];

/** The codes whose errors say "the same call may succeed later" (python/dsec/errors.py: the same set). */
const RETRYABLE = [
  'CAPACITY_EXCEEDED',
  'NODE_MEMORY_PRESSURE',
  'OUTPUT_BUDGET_EXCEEDED',
  'EDGE_UNAVAILABLE',
  'SANDBOX_MIGRATING',
  'REGISTRY_UNAVAILABLE',
  'QUOTA_CREATE_RATE_EXCEEDED',
];

const expected = new Map<string, DsecErrorClass>(EXPECTED.flatMap(([cls, codes]) => codes.map((c) => [c, cls] as const)));

describe('every registry code through the SDK', () => {
  // A stand-in for the server on loopback: it answers each path `/<CODE>` the way dsec answers
  // that code (its status, a wire error body), so both of Connection's answer paths are the ones
  // under test: json() over node:http and request() over fetch.
  let server: Server;
  let conn: Connection;
  before(async () => {
    server = createServer((req, res) => {
      const code = (req.url ?? '/').slice(1) as ErrorCode;
      res.writeHead(ERROR_CODES[code] ?? 500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code, message: `m ${code}`, details: { code } } }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    conn = new Connection({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, apiKey: 'k' });
  });
  after(() => new Promise<void>((resolve) => server.close(() => resolve())));

  for (const code of Object.keys(ERROR_CODES) as ErrorCode[]) {
    test(`${code} → ${expected.get(code)?.name ?? 'a class (missing from this test)'}`, async () => {
      const cls = expected.get(code);
      assert.ok(cls, `${code} is in the registry but not in this test's table: add it (and to python/dsec/errors.py)`);
      for (const call of [() => conn.json('GET', `/${code}`), () => conn.request('GET', `/${code}`)]) {
        const err = await call().then(
          () => assert.fail('the call should fail'),
          (e: unknown) => e,
        );
        assert.ok(err instanceof cls, `${code}: got ${String(err)}`);
        assert.ok(err instanceof DsecError && err instanceof Error);
        assert.equal(err.constructor, cls, `${code}: exactly ${cls.name}, not a subclass`);
        assert.equal(err.name, cls.name);
        assert.equal(err.code, code);
        assert.equal(err.status, ERROR_CODES[code]);
        assert.equal(err.message, `m ${code}`);
        assert.deepEqual(err.details, { code });
        assert.equal(err.retryable, RETRYABLE.includes(code), `${code}: retryable`);
      }
    });
  }
});

describe('the registry and the class table', () => {
  test('every registry code maps to a class other than the bare DsecError, and the table names no other code', () => {
    const registry = Object.keys(ERROR_CODES).sort();
    assert.deepEqual(Object.keys(ERROR_CLASSES).sort(), registry);
    for (const code of registry) {
      const cls = ERROR_CLASSES[code as ErrorCode];
      assert.notEqual(cls, DsecError, code);
      assert.equal(cls, expected.get(code), code);
    }
    assert.deepEqual([...expected.keys()].sort(), registry, "this test's table covers exactly the registry");
  });

  test('the code decides, not the status: with no status, or a proxy-made one, the class is the same', () => {
    for (const [code, cls] of expected) {
      for (const status of [undefined, 418, 500]) {
        const err = errorFromWire(status, { code, message: 'm' });
        assert.equal(err.constructor, cls, `${code} at ${status}`);
        assert.equal(err.status, status);
      }
    }
  });

  test('retryable is true exactly for capacity, unavailable and rate limits', () => {
    const retryable = Object.keys(ERROR_CODES).filter((code) => errorFromWire(undefined, { code, message: 'm' }).retryable);
    assert.deepEqual(retryable.sort(), [...RETRYABLE].sort());
    assert.equal(new DsecError('m', 'X', undefined).retryable, false);
    assert.equal(new CommandExitError(1, '', '').retryable, false);
  });

  test('statusForCode answers the registry status for every code', () => {
    for (const [code, status] of Object.entries(ERROR_CODES)) assert.equal(statusForCode(code as ErrorCode), status);
  });

  test('statuses are HTTP error statuses', () => {
    for (const status of Object.values(ERROR_CODES)) assert.ok(status >= 400 && status <= 599);
  });
});

describe('errorFromWire for what the registry does not name', () => {
  test('an unknown code falls back to its HTTP status, keeping the code', () => {
    const cases: [number | undefined, DsecErrorClass][] = [
      [400, InvalidRequestError],
      [413, InvalidRequestError],
      [416, InvalidRequestError],
      [401, AuthError],
      [403, AuthError],
      [404, NotFoundError],
      [409, ConflictError],
      [429, RateLimitError],
      [503, CapacityError],
      [500, ServerError],
      [502, ServerError],
      [418, DsecError],
      [undefined, DsecError],
    ];
    for (const [status, cls] of cases) {
      const err = errorFromWire(status, { code: 'SOMETHING_NEW', message: 'n' });
      assert.equal(err.constructor, cls, String(status));
      assert.equal(err.code, 'SOMETHING_NEW');
    }
  });

  test('a proxy 503 or 429 without a wire body is retryable', () => {
    assert.equal(errorFromWire(503, undefined).retryable, true);
    assert.equal(errorFromWire(429, undefined).retryable, true);
    assert.equal(errorFromWire(502, undefined).retryable, false);
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
});

describe('quota errors', () => {
  test('a quota code maps to QuotaError by code, not to AuthError by its 403', () => {
    const err = errorFromWire(403, { code: 'QUOTA_CPU_EXCEEDED', message: 'm', details: { quota: 'maxCpu', limit: 2 } });
    assert.ok(err instanceof QuotaError);
    assert.ok(!(err instanceof AuthError));
    assert.equal(err.name, 'QuotaError');
    assert.equal(err.retryable, false);
    assert.deepEqual(err.details, { quota: 'maxCpu', limit: 2 });
  });

  test('the create-rate quota (429) is a RateLimitError, itself a QuotaError, and retryable', () => {
    const err = errorFromWire(429, { code: 'QUOTA_CREATE_RATE_EXCEEDED', message: 'm', details: { retryAfterMs: 200 } });
    assert.ok(err instanceof RateLimitError);
    assert.ok(err instanceof QuotaError);
    assert.equal(err.retryable, true);
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
