/** `label=k=v` query parameters (once, or repeated: all must match) as one selector. */
export function parseLabels(label: string | string[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of label === undefined ? [] : Array.isArray(label) ? label : [label]) {
    const i = kv.indexOf('=');
    out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}
