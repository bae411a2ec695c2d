import { forgetKey, readKey } from './session-key';

/** The control plane's root: the dashboard is served at <root>/ui/, the API at <root>/v1/. */
export const apiRoot = new URL('../', location.href);

/** An error answer of the API, in its `{error:{code,message}}` shape. */
export class ApiCallError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Called when the API answers 401: the key was revoked or never valid; the app signs out. */
let onUnauthorized: () => void = () => {};
export function setUnauthorizedHandler(fn: () => void): void {
  onUnauthorized = fn;
}

async function errorOf(res: Response): Promise<ApiCallError> {
  const text = await res.text();
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string } };
    return new ApiCallError(res.status, body.error?.code ?? 'HTTP_' + res.status, body.error?.message ?? text);
  } catch {
    return new ApiCallError(res.status, 'HTTP_' + res.status, text || res.statusText);
  }
}

/** A call to the API with the signed-in key as a bearer token. */
export async function call(path: string, init: RequestInit & { key?: string } = {}): Promise<Response> {
  const key = init.key ?? readKey();
  const headers = new Headers(init.headers);
  if (key) headers.set('authorization', `Bearer ${key}`);
  if (init.body && !headers.has('content-type')) headers.set('content-type', 'application/json');
  const res = await fetch(new URL(path.replace(/^\//, ''), apiRoot), { ...init, headers });
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && !init.key) {
      forgetKey();
      onUnauthorized();
    }
    throw err;
  }
  return res;
}

export async function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  return (await (await call(path, { signal })).json()) as T;
}

export async function sendJson<T>(method: string, path: string, body?: unknown): Promise<T | undefined> {
  const res = await call(path, { method, body: body === undefined ? undefined : JSON.stringify(body) });
  return res.status === 204 ? undefined : ((await res.json()) as T);
}

/** Reads an NDJSON stream line by line until it ends or the signal aborts. */
export async function* ndjson<T>(path: string, signal: AbortSignal): AsyncGenerator<T> {
  const res = await call(path, { signal, headers: { accept: 'application/x-ndjson' } });
  if (!res.body) return;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
}
