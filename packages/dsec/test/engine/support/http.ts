/** Raw HTTP access for the engine tests (loopback only): NDJSON exec streams and JSON calls. */
/* eslint-disable @typescript-eslint/no-explicit-any -- wire bodies are checked field by field in the tests */
import assert from 'node:assert/strict';

export interface Server {
  url: string;
  apiKey: string;
}

export type NdjsonEvent = { type: 'stdout' | 'stderr'; data: string } | ({ type: 'exit' } & Record<string, unknown>);

/**
 * Splits a response body into parsed NDJSON lines as they arrive. The stream opens with a
 * `{type:"start"}` line (so headers go out at once); it is checked to come first and not yielded.
 */
export async function* ndjsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<NdjsonEvent> {
  let seen = 0;
  for await (const ev of rawNdjsonLines(body)) {
    seen++;
    if ((ev as { type: string }).type === 'start') {
      assert.equal(seen, 1, 'the start line comes first');
      continue;
    }
    yield ev;
  }
}

async function* rawNdjsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<NdjsonEvent> {
  const decoder = new TextDecoder();
  let buffered = '';
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffered += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      if (line.trim()) yield JSON.parse(line) as NdjsonEvent;
    }
  }
  if (buffered.trim()) yield JSON.parse(buffered) as NdjsonEvent;
}

/** POST /exec with Accept: application/x-ndjson; returns the raw response (not yet read). */
export async function execNdjson(server: Server, sandboxId: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  return fetch(`${server.url}/v1/sandboxes/${sandboxId}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
    body: JSON.stringify(body),
    signal: signal ?? AbortSignal.timeout(120_000),
  });
}

/** One JSON call; answers status and parsed body (undefined when the body is not JSON). */
export async function callJson(
  server: Server,
  method: string,
  path: string,
  json?: unknown,
  opts: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<{ status: number; body: any }> {
  assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const headers: Record<string, string> = { authorization: `Bearer ${server.apiKey}` };
  if (json !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(server.url + path, {
    method,
    headers,
    body: json === undefined ? undefined : JSON.stringify(json),
    signal: opts.signal ?? AbortSignal.timeout(opts.timeoutMs ?? 120_000),
  });
  const text = await res.text();
  let body: any;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: res.status, body };
}

/** POST /exec as JSON (the server's own timeoutMs, untouched by SDK call options); asserts 200. */
export async function execJson(server: Server, sandboxId: string, req: Record<string, unknown>): Promise<any> {
  const r = await callJson(server, 'POST', `/v1/sandboxes/${sandboxId}/exec`, req);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body;
}
