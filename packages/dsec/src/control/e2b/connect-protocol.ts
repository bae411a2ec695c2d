/**
 * The Connect protocol's wire rules, JSON codec only, as its specification describes them:
 * unary calls are a plain JSON body answered with a JSON body (errors: a non-2xx status and
 * `{code, message}`); server-streaming calls carry 5-byte envelopes (1 flag byte, 4-byte
 * big-endian length) both ways and end with an end-of-stream envelope (flag 0x02) whose JSON
 * holds the error, if any. Written here rather than pulled from @connectrpc/connect-node because
 * that package wants its own HTTP handler and generated message descriptors, which sit badly in
 * a Fastify route; the JSON framing is a page of code.
 */

/** Connect error codes, with the HTTP status a unary error answers with. */
export const CONNECT_CODES = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  out_of_range: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  data_loss: 500,
  unauthenticated: 401,
} as const;

export type ConnectCode = keyof typeof CONNECT_CODES;

export class ConnectError extends Error {
  constructor(
    readonly code: ConnectCode,
    message: string,
  ) {
    super(message);
    this.name = 'ConnectError';
  }
}

export const FLAG_COMPRESSED = 0x01;
export const FLAG_END_STREAM = 0x02;

export const STREAM_JSON = 'application/connect+json';
export const UNARY_JSON = 'application/json';

/** One envelope: flags, then the payload's length (big-endian uint32), then the payload. */
export function encodeEnvelope(flags: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

export function messageEnvelope(message: unknown): Buffer {
  return encodeEnvelope(0, Buffer.from(JSON.stringify(message)));
}

/** The last envelope of every stream: `{}` on success, `{error:{code,message}}` otherwise. */
export function endStreamEnvelope(error?: ConnectError): Buffer {
  return encodeEnvelope(FLAG_END_STREAM, Buffer.from(JSON.stringify(error ? { error: { code: error.code, message: error.message } } : {})));
}

/**
 * Splits a request body into envelopes. A server-streaming request holds exactly one message
 * envelope; anything else (a truncated frame, a compressed one we never negotiated) is refused.
 */
export function decodeEnvelopes(body: Buffer): { flags: number; payload: Buffer }[] {
  const out: { flags: number; payload: Buffer }[] = [];
  let at = 0;
  while (at < body.length) {
    if (body.length - at < 5)
      throw new ConnectError('invalid_argument', `truncated envelope: ${body.length - at} bytes left, a header needs 5`);
    const flags = body.readUInt8(at);
    const len = body.readUInt32BE(at + 1);
    if (body.length - at - 5 < len)
      throw new ConnectError('invalid_argument', `truncated envelope: header says ${len} bytes, ${body.length - at - 5} arrived`);
    if (flags & FLAG_COMPRESSED)
      throw new ConnectError('unimplemented', 'compressed envelopes are not supported: send Connect-Content-Encoding: identity');
    out.push({ flags, payload: body.subarray(at + 5, at + 5 + len) });
    at += 5 + len;
  }
  return out;
}

/** The one request message of a server-streaming call. */
export function streamRequestMessage(body: Buffer): unknown {
  const envs = decodeEnvelopes(body).filter((e) => !(e.flags & FLAG_END_STREAM));
  if (envs.length !== 1)
    throw new ConnectError('invalid_argument', `a server-streaming request carries exactly one message; got ${envs.length}`);
  return parseJson(envs[0]!.payload);
}

export function parseJson(payload: Buffer): unknown {
  if (payload.length === 0) return {};
  try {
    return JSON.parse(payload.toString('utf8')) as unknown;
  } catch (err) {
    throw new ConnectError('invalid_argument', `request is not valid JSON: ${(err as Error).message}`);
  }
}

/**
 * `Connect-Timeout-Ms`: the client's deadline for the whole call (at most 10 digits, per the
 * specification); undefined when absent.
 */
export function parseTimeoutMs(header: string | string[] | undefined): number | undefined {
  if (typeof header !== 'string' || header === '') return undefined;
  if (!/^\d{1,10}$/.test(header))
    throw new ConnectError('invalid_argument', `Connect-Timeout-Ms must be 1 to 10 digits, got ${JSON.stringify(header)}`);
  return Number(header);
}

/** Turns whatever a handler threw into a ConnectError (unexpected errors become `internal`). */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  return new ConnectError('internal', err instanceof Error ? err.message : String(err));
}
