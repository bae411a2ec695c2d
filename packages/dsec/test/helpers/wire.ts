/** Raw HTTP helpers for wire-level checks: status codes and the `{error:{code,message,details}}` body. */
import assert from 'node:assert/strict';
import type { DsecError } from '@dsec/sdk';

export interface WireResponse {
  status: number;
  headers: Headers;
  /** Parsed JSON when the body is JSON, else undefined. */
  json: unknown;
  text: string;
}

export interface WireError {
  code: string;
  message: string;
  details: Record<string, unknown>;
}

/** One request; `key: null` sends no Authorization header. Only ever talks to 127.0.0.1. */
export async function call(
  server: { url: string; apiKey: string },
  method: string,
  path: string,
  opts: { json?: unknown; body?: Uint8Array | string; contentType?: string; key?: string | null; timeoutMs?: number } = {},
): Promise<WireResponse> {
  assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/, 'tests only talk to 127.0.0.1');
  const headers: Record<string, string> = {};
  const key = opts.key === undefined ? server.apiKey : opts.key;
  if (key !== null) headers['authorization'] = `Bearer ${key}`;
  let body: string | Uint8Array | undefined;
  if (opts.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.json);
  } else if (opts.body !== undefined) {
    headers['content-type'] = opts.contentType ?? 'application/octet-stream';
    body = opts.body;
  }
  if (opts.contentType) headers['content-type'] = opts.contentType;
  const res = await fetch(server.url + path, { method, headers, body, signal: AbortSignal.timeout(opts.timeoutMs ?? 60_000) });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, json, text };
}

/** Asserts the response is a wire error with this status and code, and returns the error body. */
export function expectWireError(res: WireResponse, status: number, code: string): WireError {
  assert.equal(res.status, status, `expected HTTP ${status} ${code}, got ${res.status}: ${res.text.slice(0, 500)}`);
  const body = res.json as { error?: WireError } | undefined;
  assert.ok(body && typeof body === 'object' && body.error, `error body must be {error:{…}}, got: ${res.text.slice(0, 500)}`);
  const e = body.error;
  assert.equal(e.code, code, `error code (message: ${e.message})`);
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0, 'error message must not be empty');
  assert.equal(typeof e.details, 'object', 'error.details must be an object');
  assert.notEqual(e.details, null);
  return { code: e.code, message: e.message, details: e.details ?? {} };
}

/** Awaits a promise that must reject with a DsecError of this class and code; returns the error. */
export async function expectSdkError<T extends DsecError>(
  promise: Promise<unknown>,
  cls: new (...args: never[]) => T,
  code: string,
): Promise<T> {
  let caught: unknown;
  try {
    await promise;
  } catch (err) {
    caught = err;
  }
  assert.ok(caught !== undefined, `expected ${cls.name} ${code}, but the call succeeded`);
  assert.ok(caught instanceof cls, `expected ${cls.name}, got ${(caught as Error).name}: ${(caught as Error).message}`);
  assert.equal((caught as DsecError).code, code, `error code (message: ${(caught as Error).message})`);
  return caught as T;
}
