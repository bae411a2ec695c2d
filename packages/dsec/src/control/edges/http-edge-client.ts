import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { createInterface } from 'node:readline';
import { Readable, type Duplex } from 'node:stream';
import { awaitReady, webSocketDuplex } from '../../edge/protocol/port-stream.js';
import WebSocket from 'ws';
import type { ErrorCode } from '@dsec/sdk';
import type {
  Encoding,
  ExecRequest,
  ExecResult,
  FileStat,
  FnRunResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
  SandboxUsage,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { EdgeCalls, type EdgeCall } from './edge-calls.js';
import type {
  EdgeApi,
  EdgeCreateOutcome,
  EdgeCreateRequest,
  EdgeFnRequest,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeSandbox,
  EdgeQuiesce,
  GroupCreateListener,
  EdgeSnapshot,
  TerminalChannel,
  TerminalRequest,
} from '../../edge/protocol/edge-api.js';
import { EDGE_PREFIX } from '../../edge/protocol/schemas.js';
import { lineToEvent } from '../../edge/protocol/exec-lines.js';
import type { ExecEvent } from '../../edge/protocol/exec-event.js';
import {
  actorToQuery,
  type FileActor,
  type FileCallOptions,
  type StatOptions,
  type WriteFileOptions,
} from '../../edge/protocol/file-options.js';
import type { Link } from '../../net/address-pool.js';
import { currentRequestId, REQUEST_ID_HEADER } from '../../http/request-log.js';
import { groupBody } from './group-body.js';
import type { NetworkPolicy } from '../../net/policy.js';

const NDJSON = 'application/x-ndjson';
const OCTETS = 'application/octet-stream';
const EMPTY = Buffer.alloc(0);

/** How a call ends early and how its answer comes (see #call). */
interface CallOptions {
  signal?: AbortSignal | undefined;
  /** false: no time limit (a create fetching layers, a command running); otherwise callTimeoutMs. */
  timeout?: boolean;
  /** A successful NDJSON answer's lines, as they arrive. */
  onLine?: (line: string) => void;
}

/** `res`'s body a line at a time (empty lines skipped), then `end`; a line `onLine` throws on fails the call. */
function splitLines(res: IncomingMessage, onLine: (line: string) => void, end: () => void, fail: (err: unknown) => void): void {
  let rest = '';
  res.setEncoding('utf8');
  res.on('data', (chunk: string) => {
    const parts = (rest + chunk).split('\n');
    rest = parts.pop()!;
    try {
      for (const p of parts) if (p) onLine(p);
    } catch (err) {
      res.destroy();
      fail(err);
    }
  });
  res.on('end', () => {
    try {
      if (rest) onLine(rest);
      end();
    } catch (err) {
      fail(err);
    }
  });
  res.on('error', fail);
}

/** Network failures that mean the request never reached the edge: safe to place elsewhere. */
const NEVER_SENT = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);

/**
 * EdgeApi over HTTP: the control plane's view of an edge on another node. Every call carries the
 * cluster token; errors come back as the edge's `{error:{code,message,details}}` and are thrown as
 * ApiErrors with the same code, so callers cannot tell an in-process edge from a remote one. An
 * edge that cannot be reached is EDGE_UNAVAILABLE (with `retryable: true` when the request never
 * left, e.g. connection refused).
 *
 * One file for one concept, the client side of the edge protocol: each EdgeApi method is a few
 * lines mapping to a route, and they share the transport (#json, #send, #fetch) that the file's
 * length is mostly made of. What stands alone is in files of its own (edge-calls.ts: how a call
 * ends early; the protocol's schemas, exec lines and port streams under edge/protocol/).
 */
export class HttpEdgeClient implements EdgeApi {
  readonly #base: string;
  readonly #baseUrl: URL;
  /**
   * Calls answered whole (create, kill, info, exec, a file read or write, …) go over node:http
   * with keep-alive, not fetch: measured by `dsec bench cluster`, a fetch costs the caller ~360-780
   * µs of CPU per call against ~60-145 µs for node:http, and the control plane makes one such call
   * per create. Streams keep fetch. (undici's Pool costs ~40 µs, bench/results/cpu-31/edge-client.mjs,
   * but importing undici 7 makes its Agent the global dispatcher of Node 20's own fetch, an undici
   * 6, whose uploads with a streamed body it then refuses: UND_ERR_INVALID_ARG on registry pushes.)
   */
  readonly #agent: HttpAgent;
  /** Aborted when the edge is declared lost: streams hung on a partitioned link end then. */
  #lost = new AbortController();
  /** The JSON calls in flight, ended by their timeout, their caller or the edge's loss. */
  readonly #calls = new EdgeCalls();

  constructor(
    readonly edgeId: string,
    readonly url: string,
    readonly token: string,
    /** Per-call timeout for calls that do not run commands (ms). */
    readonly callTimeoutMs = 30_000,
  ) {
    this.#base = `${url.replace(/\/$/, '')}${EDGE_PREFIX}`;
    this.#baseUrl = new URL(this.#base);
    this.#agent = this.#baseUrl.protocol === 'https:' ? new HttpsAgent({ keepAlive: true }) : new HttpAgent({ keepAlive: true });
  }

  async #fetch(path: string, init: RequestInit & { timeout?: boolean } = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set('authorization', `Bearer ${this.token}`);
    const reqId = currentRequestId();
    if (reqId) headers.set(REQUEST_ID_HEADER, reqId);
    const lost = this.#lost.signal;
    const signals = [init.signal, lost, init.timeout === false ? undefined : AbortSignal.timeout(this.callTimeoutMs)].filter(
      (s): s is AbortSignal => !!s,
    );
    let res: Response;
    try {
      res = await fetch(`${this.#base}${path}`, { ...init, headers, signal: AbortSignal.any(signals) });
    } catch (err) {
      if (init.signal?.aborted) throw err;
      if (lost.aborted)
        throw new ApiError(
          'EDGE_UNAVAILABLE',
          `edge ${this.edgeId} was lost during the call (no heartbeat); the outcome on the edge is unknown`,
          { edge: this.edgeId, retryable: false },
        );
      const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).name;
      throw new ApiError('EDGE_UNAVAILABLE', `edge ${this.edgeId} at ${this.url} did not answer: ${cause}`, {
        edge: this.edgeId,
        cause,
        retryable: NEVER_SENT.has(cause),
      });
    }
    if (res.ok) return res;
    let body: { error?: { code?: string; message?: string; details?: Record<string, unknown> } } | undefined;
    try {
      body = (await res.json()) as typeof body;
    } catch {
      body = undefined;
    }
    const code = (body?.error?.code ?? 'INTERNAL') as ErrorCode;
    throw new ApiError(code, body?.error?.message ?? `edge ${this.edgeId} answered HTTP ${res.status}`, body?.error?.details ?? {});
  }

  /** A JSON call: `body` sent as JSON (none when undefined), the answer parsed (undefined when empty). */
  async #json<T>(method: string, path: string, body?: unknown, opts: CallOptions = {}): Promise<T> {
    const payload = body === undefined ? undefined : { bytes: Buffer.from(JSON.stringify(body)), type: 'application/json' };
    const answer = await this.#call(method, path, payload, opts);
    return parsed<T>(answer);
  }

  /**
   * One call of any body, answered with its bytes (none when its NDJSON lines went to `onLine`).
   * An error status is thrown as the edge's ApiError; no answer is EDGE_UNAVAILABLE, saying why.
   */
  async #call(method: string, path: string, payload: { bytes: Buffer; type: string } | undefined, opts: CallOptions = {}): Promise<Buffer> {
    const call = this.#calls.start(opts.timeout === false ? undefined : this.callTimeoutMs, opts.signal);
    let res: { status: number; bytes: Buffer };
    try {
      res = await this.#send(method, path, payload, call, opts.onLine);
    } catch (err) {
      const ended = call.ended;
      if (ended?.why === 'caller') throw ended.reason;
      if (ended?.why === 'lost')
        throw new ApiError(
          'EDGE_UNAVAILABLE',
          `edge ${this.edgeId} was lost during the call (no heartbeat); the outcome on the edge is unknown`,
          { edge: this.edgeId, retryable: false },
        );
      const cause = ended?.why === 'timeout' ? 'TimeoutError' : ((err as NodeJS.ErrnoException).code ?? (err as Error).name);
      throw new ApiError('EDGE_UNAVAILABLE', `edge ${this.edgeId} at ${this.url} did not answer: ${cause}`, {
        edge: this.edgeId,
        cause,
        retryable: NEVER_SENT.has(cause),
      });
    } finally {
      call.done();
    }
    if (res.status >= 200 && res.status < 300) return res.bytes;
    let parsed: { error?: { code?: string; message?: string; details?: Record<string, unknown> } } | undefined;
    try {
      parsed = JSON.parse(res.bytes.toString('utf8')) as typeof parsed;
    } catch {
      parsed = undefined;
    }
    const code = (parsed?.error?.code ?? 'INTERNAL') as ErrorCode;
    throw new ApiError(code, parsed?.error?.message ?? `edge ${this.edgeId} answered HTTP ${res.status}`, parsed?.error?.details ?? {});
  }

  /**
   * One request on a kept-alive connection. A connection the edge closed while it idled fails at
   * once with ECONNRESET on reuse (the request never reached a handler): that one is sent again on
   * a fresh connection, as Node's documentation advises. With `onLine` the call asks for NDJSON, and
   * a successful NDJSON answer goes to it a line at a time as it arrives (the bytes are then none).
   * `call` ends the request early (edge-calls.ts).
   */
  #send(
    method: string,
    path: string,
    payload: { bytes: Buffer; type: string } | undefined,
    call: EdgeCall,
    onLine?: (line: string) => void,
    retried = false,
  ): Promise<{ status: number; bytes: Buffer }> {
    const headers: Record<string, string | number> = { authorization: `Bearer ${this.token}` };
    if (onLine) headers['accept'] = NDJSON;
    const reqId = currentRequestId();
    if (reqId) headers[REQUEST_ID_HEADER] = reqId;
    if (payload) {
      headers['content-type'] = payload.type;
      headers['content-length'] = payload.bytes.length;
    }
    const u = this.#baseUrl;
    const request = u.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise((resolve, reject) => {
      const req = request(
        {
          protocol: u.protocol,
          hostname: u.hostname,
          port: u.port,
          method,
          path: `${u.pathname}${path}`,
          headers,
          agent: this.#agent,
        },
        (res: IncomingMessage) => {
          const status = res.statusCode ?? 0;
          if (onLine && status >= 200 && status < 300 && (res.headers['content-type'] ?? '').includes(NDJSON)) {
            splitLines(res, onLine, () => resolve({ status, bytes: EMPTY }), reject);
            return;
          }
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => resolve({ status, bytes: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) }));
          res.on('error', reject);
        },
      );
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (!retried && req.reusedSocket && err.code === 'ECONNRESET' && !call.ended)
          this.#send(method, path, payload, call, onLine, true).then(resolve, reject);
        else reject(err);
      });
      call.attach(req);
      req.end(payload?.bytes);
    });
  }

  #sb(id: string, rest = ''): string {
    return `/sandboxes/${encodeURIComponent(id)}${rest}`;
  }

  /** Ends every call in flight (the edge was declared lost); later calls start afresh. */
  abortInflight(): void {
    this.#lost.abort();
    this.#lost = new AbortController();
    this.#calls.endAll();
  }

  /** A function call: as long as the call's own timeout (the edge enforces it), so no transport timeout. */
  runFn(req: EdgeFnRequest, signal?: AbortSignal): Promise<FnRunResult> {
    return this.#json('POST', '/fn/run', req, { signal, timeout: false });
  }

  info(): Promise<EdgeInfo> {
    return this.#json('GET', '/info');
  }

  createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    // A create may fetch layers over the network first: no short timeout.
    return this.#json('POST', '/sandboxes', req, { timeout: false });
  }

  async createSandboxes(reqs: EdgeCreateRequest[], listener?: GroupCreateListener): Promise<EdgeCreateOutcome[]> {
    const path = '/sandboxes/group';
    const body = { bytes: Buffer.from(groupBody(reqs)), type: 'application/json' };
    if (!listener) return parsed<{ results: EdgeCreateOutcome[] }>(await this.#call('POST', path, body, { timeout: false })).results;
    const out = new Array<EdgeCreateOutcome | undefined>(reqs.length);
    let accepted = false;
    const accept = (): void => {
      if (!accepted) listener.accepted?.();
      accepted = true;
    };
    const heard = (index: number, outcome: EdgeCreateOutcome): void => {
      if (!Number.isInteger(index) || index < 0 || index >= reqs.length || out[index]) return;
      accept();
      out[index] = outcome;
      listener.outcome?.(index, outcome);
    };
    const answer = await this.#call('POST', path, body, {
      timeout: false,
      onLine: (line) => {
        const parsed = JSON.parse(line) as EdgeCreateOutcome & { index?: number; accepted?: number };
        if (parsed.accepted !== undefined) return accept();
        // The outcome without the line's index, as a literal: an object rest (`{ index, ...outcome }`)
        // is a copy V8's runtime makes a property at a time, for every create of a group.
        const { id, sandbox, error } = parsed;
        heard(parsed.index ?? -1, error ? { id, error } : sandbox ? { id, sandbox } : { id });
      },
    });
    const whole = parsed<{ results: EdgeCreateOutcome[] } | undefined>(answer);
    // An edge that answers a group in one piece (before streamed answers) is heard all at once.
    whole?.results.forEach((o, i) => heard(i, o));
    return reqs.map(
      (r, i) =>
        out[i] ?? {
          id: r.id,
          error: {
            code: 'EDGE_UNAVAILABLE',
            message: `edge ${this.edgeId} ended its answer to a group create without ${r.id}'s outcome; its state there is unknown`,
            details: { edge: this.edgeId, retryable: false },
          },
        },
    );
  }

  async killSandbox(id: string): Promise<void> {
    await this.#json('DELETE', this.#sb(id), undefined, { timeout: false });
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    return (await this.#json<{ sandboxes: EdgeSandbox[] }>('GET', '/sandboxes')).sandboxes;
  }

  exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    return this.#json('POST', this.#sb(id, '/exec'), req, { signal, timeout: false });
  }

  async *execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    const ctrl = new AbortController();
    const onAbort = (): void => ctrl.abort();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const res = await this.#fetch(this.#sb(id, '/exec'), {
        method: 'POST',
        body: JSON.stringify(req),
        headers: { 'content-type': 'application/json', accept: 'application/x-ndjson' },
        signal: ctrl.signal,
        timeout: false,
      });
      const lines = createInterface({ input: Readable.fromWeb(res.body as WebReadableStream), crlfDelay: Infinity });
      for await (const line of lines) {
        if (!line) continue;
        const ev = lineToEvent(line);
        if (ev) yield ev;
      }
    } finally {
      signal?.removeEventListener('abort', onAbort);
      ctrl.abort(); // the caller stopped iterating: the edge kills the command when the stream closes
    }
  }

  startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    return this.#json('POST', this.#sb(id, '/processes'), req);
  }

  async listProcesses(id: string): Promise<ProcessInfo[]> {
    return (await this.#json<{ processes: ProcessInfo[] }>('GET', this.#sb(id, '/processes'))).processes;
  }

  processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#json(
      'GET',
      this.#sb(id, `/processes/${encodeURIComponent(pid)}?stdout=${offsets.stdout}&stderr=${offsets.stderr}&encoding=${encoding}`),
    );
  }

  waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#json('POST', this.#sb(id, `/processes/${encodeURIComponent(pid)}/wait`), { timeoutMs }, { timeout: false });
  }

  signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    return this.#json('POST', this.#sb(id, `/processes/${encodeURIComponent(pid)}/signal`), { signal });
  }

  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    await this.#call('POST', this.#sb(id, `/processes/${encodeURIComponent(pid)}/stdin?eof=${eof}`), { bytes: data, type: OCTETS });
  }

  openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    return this.#json('POST', this.#sb(id, '/sessions'), req);
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    return (await this.#json<{ sessions: SessionInfo[] }>('GET', this.#sb(id, '/sessions'))).sessions;
  }

  sessionExec(id: string, sid: string, req: SessionExecRequest, signal?: AbortSignal): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#json('POST', this.#sb(id, `/sessions/${encodeURIComponent(sid)}/exec`), req, { signal, timeout: false });
  }

  async closeSession(id: string, sid: string): Promise<void> {
    await this.#json('DELETE', this.#sb(id, `/sessions/${encodeURIComponent(sid)}`));
  }

  sandboxUsage(id: string): Promise<SandboxUsage> {
    return this.#json('GET', this.#sb(id, '/usage'));
  }

  async pauseSandbox(id: string): Promise<void> {
    await this.#json('POST', this.#sb(id, '/pause'));
  }

  async resumeSandbox(id: string): Promise<void> {
    await this.#json('POST', this.#sb(id, '/resume'));
  }

  quiesceSandbox(id: string, opts: { endProcesses: boolean }): Promise<EdgeQuiesce> {
    return this.#json('POST', this.#sb(id, '/quiesce'), opts, { timeout: false });
  }

  setNetwork(id: string, policy: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    return this.#json('PUT', this.#sb(id, '/network'), policy);
  }

  getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    return this.#json('GET', this.#sb(id, '/network'));
  }

  snapshotSandbox(
    id: string,
    opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean; portable?: boolean } = {},
  ): Promise<EdgeSnapshot> {
    const { signal, ...body } = opts;
    return this.#json('POST', this.#sb(id, '/snapshot'), body, { timeout: false, signal });
  }

  async openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    const q = new URLSearchParams({ cols: String(req.cols), rows: String(req.rows) });
    for (const c of req.cmd ?? []) q.append('cmd', c);
    if (req.cwd !== undefined) q.set('cwd', req.cwd);
    if (req.env !== undefined) q.set('env', JSON.stringify(req.env));
    const ws = new WebSocket(`${this.#base.replace(/^http/, 'ws')}${this.#sb(id, '/pty')}?${q.toString()}`, {
      headers: { authorization: `Bearer ${this.token}` },
    });
    const listeners: ((data: Buffer) => void)[] = [];
    let resolveExit!: (code: number) => void;
    const exit = new Promise<number>((r) => (resolveExit = r));
    // Every listener is attached before the first await: ws parses frames that arrive with the
    // upgrade answer in the same tick it emits 'open', so a listener added later misses them.
    // The edge answers an open with a text frame first: {type:ready}, or {type:error} when it
    // could not open the terminal (no such sandbox, not running); output follows only a ready.
    let exitCode: number | undefined;
    const opened = new Promise<void>((resolve, reject) => {
      ws.on('unexpected-response', (_req, res) =>
        reject(
          new ApiError(
            res.statusCode === 401 ? 'UNAUTHORIZED' : 'EDGE_UNAVAILABLE',
            `edge ${this.edgeId} refused the terminal: HTTP ${res.statusCode}`,
          ),
        ),
      );
      ws.on('error', (err) => reject(new ApiError('EDGE_UNAVAILABLE', `edge ${this.edgeId}: ${err.message}`, { edge: this.edgeId })));
      ws.on('message', (msg: Buffer, isBinary: boolean) => {
        if (isBinary) {
          for (const l of listeners) l(msg);
          return;
        }
        const m = JSON.parse(msg.toString('utf8')) as {
          type: string;
          exitCode?: number;
          error?: { code: ErrorCode; message: string; details?: Record<string, unknown> };
        };
        if (m.type === 'ready') resolve();
        if (m.type === 'exit') exitCode = m.exitCode ?? 0;
        if (m.type === 'error' && m.error) reject(new ApiError(m.error.code, m.error.message, m.error.details ?? {}));
      });
      ws.on('close', () => {
        resolveExit(exitCode ?? 137);
        reject(new ApiError('EDGE_UNAVAILABLE', `edge ${this.edgeId} closed the terminal before it opened`, { edge: this.edgeId }));
      });
    });
    await opened;
    return {
      exit,
      onData: (l) => listeners.push(l),
      write: (data) => {
        if (ws.readyState === WebSocket.OPEN) ws.send(Buffer.isBuffer(data) ? data : Buffer.from(data, 'utf8'), { binary: true });
      },
      resize: (cols, rows) => {
        if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
      },
      kill: () => ws.close(),
    };
  }

  async createVolume(name: string): Promise<void> {
    await this.#json('PUT', `/volumes/${encodeURIComponent(name)}`);
  }

  async deleteVolume(name: string): Promise<void> {
    await this.#json('DELETE', `/volumes/${encodeURIComponent(name)}`, undefined, { timeout: false });
  }

  volumeUsage(name: string): Promise<{ bytes: number }> {
    return this.#json('GET', `/volumes/${encodeURIComponent(name)}/usage`, undefined, { timeout: false });
  }

  async openPort(id: string, port: number): Promise<Duplex> {
    const ws = new WebSocket(`${this.#base.replace(/^http/, 'ws')}${this.#sb(id, `/ports/${port}`)}`, {
      headers: { authorization: `Bearer ${this.token}` },
    });
    // Both attached before the first await (see openPty): bytes that follow ready in the same read land in the stream.
    const ready = awaitReady(ws, `edge ${this.edgeId}`);
    const stream = webSocketDuplex(ws);
    try {
      await ready;
    } catch (err) {
      stream.destroy();
      throw err;
    }
    return stream;
  }

  readFile(id: string, path: string, maxBytes: number, opts: FileCallOptions = {}): Promise<Buffer> {
    return this.#call('GET', this.#sb(id, `/files?${fileQuery({ path, maxBytes: String(maxBytes) }, opts)}`), undefined);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number, opts: WriteFileOptions = {}): Promise<number> {
    const meta: Record<string, string> = opts.metadata ? { metadata: JSON.stringify(opts.metadata) } : {};
    const answer = await this.#call('PUT', this.#sb(id, `/files?${fileQuery({ path, mode: String(mode), ...meta }, opts)}`), {
      bytes: data,
      type: OCTETS,
    });
    return (JSON.parse(answer.toString('utf8')) as { bytes: number }).bytes;
  }

  statPath(id: string, path: string, opts: StatOptions = {}): Promise<FileStat> {
    return this.#json('GET', this.#sb(id, `/files/stat?${fileQuery({ path }, opts)}`));
  }

  listDir(id: string, path: string, opts: StatOptions = {}): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return this.#json('GET', this.#sb(id, `/files/list?${fileQuery({ path }, opts)}`));
  }

  async makeDir(id: string, path: string, parents: boolean, opts: FileCallOptions = {}): Promise<void> {
    await this.#json('POST', this.#sb(id, '/files/mkdir'), { path, parents, ...bodyAs(opts) });
  }

  async removePath(id: string, path: string, recursive: boolean, opts: FileCallOptions = {}): Promise<void> {
    await this.#json('POST', this.#sb(id, '/files/remove'), { path, recursive, ...bodyAs(opts) }, { timeout: false });
  }

  async renamePath(id: string, from: string, to: string, opts: FileCallOptions = {}): Promise<void> {
    await this.#json('POST', this.#sb(id, '/files/rename'), { from, to, ...bodyAs(opts) });
  }

  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const res = await this.#fetch(this.#sb(id, `/files/tar?path=${encodeURIComponent(dir)}`), {
      method: 'PUT',
      body: Readable.toWeb(Readable.from(body)) as unknown as ReadableStream,
      headers: { 'content-type': 'application/x-tar' },
      duplex: 'half',
      timeout: false,
    } as RequestInit & { timeout: boolean });
    return ((await res.json()) as { bytes: number }).bytes;
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const res = await this.#fetch(this.#sb(id, `/files/tar?path=${encodeURIComponent(path)}`), { timeout: false });
    return Readable.fromWeb(res.body as WebReadableStream);
  }
}

/** A file call's query string: its own fields, then `as` and `metadataPrefix` when given (edge-server.ts). */
/** A JSON answer's value (undefined when the answer is empty). */
function parsed<T>(answer: Buffer): T {
  return (answer.length === 0 ? undefined : JSON.parse(answer.toString('utf8'))) as T;
}

function fileQuery(fields: Record<string, string>, opts: StatOptions): string {
  const q = new URLSearchParams(fields);
  if (opts.as) q.set('as', actorToQuery(opts.as));
  if (opts.metadataPrefix !== undefined) q.set('metadataPrefix', opts.metadataPrefix);
  return q.toString();
}

function bodyAs(opts: FileCallOptions): { as?: FileActor } {
  return opts.as ? { as: { uid: opts.as.uid, gid: opts.as.gid, groups: opts.as.groups } } : {};
}
