/**
 * The JSON values of a newline-delimited response body, as they arrive (the benchmarks read
 * batch events and bulk-kill progress this way). A last line without its newline is not a
 * whole value yet and is left out.
 */
export async function* ndjsonLines<T>(body: AsyncIterable<Uint8Array>): AsyncGenerator<T> {
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
}
