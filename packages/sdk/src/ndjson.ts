/** Parses a newline-delimited JSON response body into objects, as they arrive. */
export async function* readNdjson<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<T> {
  const decoder = new TextDecoder();
  let buffered = '';
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
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
