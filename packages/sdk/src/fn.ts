import { ERROR_CODES, errorFromWire, type DsecError, type ErrorCode } from './errors.js';
import { type CallOptions, Connection, type ConnectionOptions } from './connection.js';
import { readNdjson } from './ndjson.js';
import { FnBatchRequest, FnRunRequest, type FnBatchLine, type FnRunResult } from './schema/index.js';
import { checkBody } from './validate.js';

type Opts = ConnectionOptions & CallOptions;

/** One call of a map: its result, or the error that kept it from running. */
export interface FnOutcome {
  index: number;
  result?: FnRunResult;
  error?: DsecError;
}

function lineError(line: FnBatchLine): DsecError | undefined {
  if (!line.error) return undefined;
  const status = (ERROR_CODES as Record<string, number>)[line.error.code as ErrorCode] ?? 500;
  return errorFromWire(status, { code: line.error.code, message: line.error.message, details: { index: line.index } });
}

/**
 * Function calls: short stateless programs (python, node, bash) in warm workers on the server,
 * each in a fresh process and scratch dir with nothing kept between calls and no network unless
 * asked. A non-zero exit is a result (`exitCode`), not an error.
 */
export const fn = {
  /**
   * Runs one call. `call.timeoutMs` limits the program; `opts.timeoutMs` the HTTP call (default:
   * the program's limit plus a minute, room for a cold worker start).
   * @example const r = await fn.run({ runtime: 'python', code: 'print(sum(map(int, input().split())))', stdin: '1 2 3' });
   */
  async run(call: FnRunRequest, opts: Opts = {}): Promise<FnRunResult> {
    const { signal, timeoutMs, ...connOpts } = opts;
    checkBody(FnRunRequest, call, 'fn.run');
    const conn = new Connection(connOpts);
    return conn.json<FnRunResult>('POST', '/v1/fn/run', {
      json: call,
      signal,
      timeoutMs: timeoutMs ?? (call.timeoutMs ?? 10_000) + 60_000,
    });
  },

  /**
   * Runs many calls, `concurrency` at a time on the server, and yields each outcome as it
   * finishes (in finishing order; `index` says which call it was).
   */
  async *mapIter(calls: FnRunRequest[], opts: Opts & { concurrency?: number } = {}): AsyncGenerator<FnOutcome> {
    const { signal, timeoutMs, concurrency, ...connOpts } = opts;
    const body: FnBatchRequest = { calls, ...(concurrency !== undefined ? { concurrency } : {}) };
    checkBody(FnBatchRequest, body, 'fn.map');
    const conn = new Connection(connOpts);
    const res = await conn.request('POST', '/v1/fn/batch', {
      json: body,
      accept: 'application/x-ndjson',
      signal,
      timeoutMs: timeoutMs ?? 24 * 3600_000,
    });
    for await (const line of readNdjson<FnBatchLine>(res.body!)) {
      const error = lineError(line);
      yield error ? { index: line.index, error } : { index: line.index, result: line.result! };
    }
  },

  /**
   * Runs many calls and resolves with their results in the order of `calls`. A call that could not
   * run (no capacity, a bad image) rejects the whole map with its error; use mapIter to take
   * outcomes one by one instead.
   * @example const rs = await fn.map(cases.map((c) => ({ runtime: 'python', code, stdin: c.input })), { concurrency: 32 });
   */
  async map(calls: FnRunRequest[], opts: Opts & { concurrency?: number } = {}): Promise<FnRunResult[]> {
    const out = new Array<FnRunResult>(calls.length);
    for await (const o of fn.mapIter(calls, opts)) {
      if (o.error) throw o.error;
      out[o.index] = o.result!;
    }
    return out;
  },
};
