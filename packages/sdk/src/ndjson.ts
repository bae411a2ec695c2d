import { TimeoutError, UnreachableError } from './errors.js';

/** Parses a newline-delimited JSON response body into objects, as they arrive. */
export async function* readNdjson<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<T> {
  const decoder = new TextDecoder();
  let buffered = '';
  const reader = body.getReader();
  try {
    for (;;) {
      let chunk: Awaited<ReturnType<typeof reader.read>>;
      try {
        chunk = await reader.read();
      } catch (err) {
        // The call's deadline or signal fired mid-stream.
        if (err instanceof Error && (err.name === 'TimeoutError' || err.name === 'AbortError')) {
          throw new TimeoutError(`the stream was cut by its deadline or signal: ${err.message}`, 'TIMEOUT', undefined);
        }
        throw new UnreachableError(`the stream broke: ${(err as Error).message}`, 'STREAM_BROKEN', undefined);
      }
      const { value, done } = chunk;
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (line) yield JSON.parse(line) as T;
      }
    }
    if (buffered.trim()) yield JSON.parse(buffered) as T;
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
