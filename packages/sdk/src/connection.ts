import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { AbortedError, DsecError, NotConfiguredError, TimeoutError, UnreachableError, errorFromWire } from './errors.js';
import { httpCall, type HttpAnswer } from './http-call.js';

/** Where dsec keeps its state unless told otherwise; `dsec up` writes client.json there. */
export const DEFAULT_DATA_DIR = '/var/lib/dsec';

export interface ConnectionOptions {
  /** Base URL of the control plane. @default process.env.DSEC_URL, else client.json */
  url?: string;
  /** API key. @default process.env.DSEC_API_KEY, else client.json */
  apiKey?: string;
  /** Default per-call timeout in ms. @default 120000 */
  requestTimeoutMs?: number;
}

/** Options every call accepts. */
export interface CallOptions {
  /** Aborts the call: it fails with AbortedError (TimeoutError when the signal's reason is a timeout, as with AbortSignal.timeout()). */
  signal?: AbortSignal;
  /** Fail the call with TimeoutError after this long. @default the connection's requestTimeoutMs (120000) */
  timeoutMs?: number;
}

/**
 * The error for a call that was cut short: by the caller's own signal (AbortedError, or
 * TimeoutError naming the signal when its reason is a timeout), or by the call's deadline
 * (TimeoutError naming the deadline). Undefined when `err` is not an abort.
 */
export function abortedError(
  err: unknown,
  method: string,
  path: string,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): DsecError | undefined {
  if (err instanceof DsecError) return err;
  // fetch rejects with the signal's reason itself when the caller gave one, whatever it is.
  if (signal?.aborted) {
    const reason: unknown = signal.reason;
    if (reason instanceof Error && reason.name === 'TimeoutError') {
      return new TimeoutError(`${method} ${path} was aborted: the caller's signal timed out (${reason.message})`, 'ABORTED', undefined, {
        by: 'signal',
      });
    }
    const why = reason instanceof Error ? reason.message : reason === undefined ? 'no reason given' : String(reason);
    return new AbortedError(`${method} ${path} was aborted by the caller's signal (${why})`, 'ABORTED', undefined, { by: 'signal' });
  }
  if (!(err instanceof Error) || (err.name !== 'TimeoutError' && err.name !== 'AbortError')) return undefined;
  return new TimeoutError(
    `${method} ${path} did not finish within ${timeoutMs} ms (the call's timeoutMs / requestTimeoutMs)`,
    'TIMEOUT',
    undefined,
    {
      by: 'timeout',
      timeoutMs,
    },
  );
}

/** Whether two URLs are one origin (scheme, host, port); an unparsable one matches nothing. */
function sameOrigin(a: string, b: string): boolean {
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}

interface ClientFile {
  url: string;
  apiKey: string;
}

function readClientFile(): Partial<ClientFile> {
  const dir = process.env['DSEC_DATA_DIR'] ?? DEFAULT_DATA_DIR;
  try {
    return JSON.parse(readFileSync(join(dir, 'client.json'), 'utf8')) as Partial<ClientFile>;
  } catch {
    return {};
  }
}

/**
 * Resolves url and key: explicit options, then DSEC_URL/DSEC_API_KEY, then DATA_DIR/client.json.
 * client.json's key goes only to the server client.json names: a url given another way (DSEC_URL
 * at a remote cluster) without a key must not be sent this host's local admin key.
 */
export function resolveConnection(opts: ConnectionOptions = {}): Required<ConnectionOptions> {
  let url = opts.url ?? process.env['DSEC_URL'];
  let apiKey = opts.apiKey ?? process.env['DSEC_API_KEY'];
  let otherServer: string | undefined;
  if (url === undefined || apiKey === undefined) {
    const file = readClientFile();
    if (url === undefined) {
      url = file.url;
      apiKey ??= file.apiKey;
    } else if (file.apiKey !== undefined && file.url !== undefined) {
      if (sameOrigin(file.url, url)) apiKey = file.apiKey;
      else otherServer = file.url;
    }
  }
  if (url !== undefined && apiKey === undefined && otherServer !== undefined) {
    throw new NotConfiguredError(
      `no API key for ${url}: set DSEC_API_KEY (or pass apiKey); client.json's key is for ${otherServer} and is not sent elsewhere`,
      'NOT_CONFIGURED',
      undefined,
      { url, clientFileUrl: otherServer },
    );
  }
  if (url === undefined || apiKey === undefined) {
    const dir = process.env['DSEC_DATA_DIR'] ?? DEFAULT_DATA_DIR;
    const missing = [url === undefined ? 'url' : '', apiKey === undefined ? 'apiKey' : ''].filter(Boolean).join(' and ');
    throw new NotConfiguredError(
      `no dsec server configured (no ${missing}): pass { url, apiKey }, set DSEC_URL and DSEC_API_KEY, or set DSEC_DATA_DIR to the data dir of a running \`dsec up\` ` +
        `(it writes client.json there; looked in ${join(dir, 'client.json')}${process.env['DSEC_DATA_DIR'] === undefined ? ', the default data dir' : ''})`,
      'NOT_CONFIGURED',
      undefined,
      { clientFile: join(dir, 'client.json') },
    );
  }
  return { url: url.replace(/\/+$/, ''), apiKey, requestTimeoutMs: opts.requestTimeoutMs ?? 120_000 };
}

/** What every call may carry besides method and path. */
export type CallInit = {
  json?: unknown;
  body?: Uint8Array;
  contentType?: string;
  accept?: string;
  query?: Record<string, string | string[] | undefined>;
} & CallOptions;

interface WireError {
  error?: { code?: string; message?: string; details?: Record<string, unknown> };
}

/** A thin HTTP transport: auth header, JSON bodies, timeouts and wire errors mapped to classes. */
/** Pauses between tries of a call refused with a retryable EDGE_UNAVAILABLE: doubling, up to the cap. */
const RETRY_FIRST_MS = 250;
const RETRY_MAX_MS = 2000;
/** The refusals tried again (with `details.retryable`): nothing was sent to an edge. */
const RETRIED_CODES = new Set(['EDGE_UNAVAILABLE', 'SANDBOX_MIGRATING']);

export class Connection {
  readonly url: string;
  readonly apiKey: string;
  readonly #timeoutMs: number;

  constructor(opts: ConnectionOptions = {}) {
    const resolved = resolveConnection(opts);
    this.url = resolved.url;
    this.apiKey = resolved.apiKey;
    this.#timeoutMs = resolved.requestTimeoutMs;
  }

  /**
   * A call whose answer is read as a stream (NDJSON, tar, file bytes): through fetch(), whose
   * Response body is a web stream. A non-2xx answer throws the mapped error.
   */
  async request(method: string, path: string, init: CallInit = {}): Promise<Response> {
    return this.#retrying(init, (once) => this.#requestOnce(method, path, once));
  }

  async #requestOnce(method: string, path: string, init: CallInit): Promise<Response> {
    const { url, headers, body, timeoutMs } = this.#prepare(path, init);
    const signals = [AbortSignal.timeout(timeoutMs)];
    if (init.signal) signals.push(init.signal);
    let res: Response;
    try {
      res = await fetch(url, { method, headers, body, signal: AbortSignal.any(signals) });
    } catch (err) {
      throw this.#failure(err, method, path, timeoutMs, init.signal);
    }
    if (!res.ok) {
      let wire: WireError | undefined;
      try {
        wire = (await res.json()) as WireError;
      } catch {
        wire = undefined;
      }
      throw errorFromWire(res.status, wire?.error);
    }
    return res;
  }

  /**
   * A call answered with JSON (or 204), read whole: over node:http with a keep-alive agent
   * (http-call.ts: a fraction of fetch()'s cost per call, which counts on every exec).
   */
  async json<T>(method: string, path: string, init: CallInit = {}): Promise<T> {
    return this.#retrying(init, (once) => this.#jsonOnce<T>(method, path, once));
  }

  /**
   * Tries a call again while the server refuses it with a retryable EDGE_UNAVAILABLE (the
   * sandbox's edge stopped reporting, and nothing was sent to it: a GC pause or a network blip
   * on that node) or SANDBOX_MIGRATING (it is moving to another edge; nothing was sent to
   * either), until the call's own deadline; then the last refusal is thrown.
   */
  async #retrying<T>(init: CallInit, call: (once: CallInit) => Promise<T>): Promise<T> {
    // The window is the call's timeout from the first try; each try gets the whole timeout, so a
    // command's own timeoutMs (in its body) is never cut short by the time spent waiting.
    const windowEnd = Date.now() + (init.timeoutMs ?? this.#timeoutMs);
    for (let pause = RETRY_FIRST_MS; ; pause = Math.min(pause * 2, RETRY_MAX_MS)) {
      try {
        return await call(init);
      } catch (err) {
        const retry = err instanceof DsecError && RETRIED_CODES.has(err.code) && err.details['retryable'] === true;
        if (!retry || Date.now() + pause >= windowEnd || init.signal?.aborted) throw err;
        await new Promise((resolve) => setTimeout(resolve, pause));
      }
    }
  }

  async #jsonOnce<T>(method: string, path: string, init: CallInit): Promise<T> {
    const { url, headers, body, timeoutMs } = this.#prepare(path, init);
    let answer: HttpAnswer;
    try {
      answer = await httpCall({ method, url, headers, body, timeoutMs, signal: init.signal });
    } catch (err) {
      throw this.#failure(err, method, path, timeoutMs, init.signal);
    }
    if (answer.status < 200 || answer.status > 299) {
      let wire: WireError | undefined;
      try {
        wire = JSON.parse(answer.body.toString('utf8')) as WireError;
      } catch {
        wire = undefined;
      }
      throw errorFromWire(answer.status, wire?.error);
    }
    if (answer.status === 204) return undefined as T;
    return JSON.parse(answer.body.toString('utf8')) as T;
  }

  #prepare(
    path: string,
    init: CallInit,
  ): { url: URL; headers: Record<string, string>; body: string | Uint8Array | undefined; timeoutMs: number } {
    const url = new URL(this.url + path);
    for (const [k, v] of Object.entries(init.query ?? {})) {
      if (v === undefined) continue;
      for (const one of Array.isArray(v) ? v : [v]) url.searchParams.append(k, one);
    }
    const headers: Record<string, string> = { authorization: `Bearer ${this.apiKey}` };
    let body: string | Uint8Array | undefined;
    if (init.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(init.json);
    } else if (init.body !== undefined) {
      headers['content-type'] = init.contentType ?? 'application/octet-stream';
      body = init.body;
    }
    if (init.accept) headers['accept'] = init.accept;
    return { url, headers, body, timeoutMs: init.timeoutMs ?? this.#timeoutMs };
  }

  /** What a call that got no answer throws: its abort or deadline, else UNREACHABLE. */
  #failure(err: unknown, method: string, path: string, timeoutMs: number, signal: AbortSignal | undefined): DsecError {
    return (
      abortedError(err, method, path, timeoutMs, signal) ??
      new UnreachableError(`cannot reach dsec at ${this.url}: ${(err as Error).message}`, 'UNREACHABLE', undefined)
    );
  }
}
