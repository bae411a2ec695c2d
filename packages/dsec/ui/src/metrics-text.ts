/**
 * The sum of every sample of one metric in Prometheus' text format (all label sets), or
 * undefined when the text has none. Summing over labels keeps the create-rate chart right
 * whether the counter is one series or split by backend, code or edge.
 */
export function sumMetric(text: string, name: string): number | undefined {
  let sum: number | undefined;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name) || line.startsWith('#')) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== ' ' && rest[0] !== '{') continue; // another metric sharing the prefix
    const afterLabels = rest[0] === '{' ? rest.slice(rest.lastIndexOf('}') + 1) : rest;
    const value = Number(afterLabels.trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) sum = (sum ?? 0) + value;
  }
  return sum;
}
