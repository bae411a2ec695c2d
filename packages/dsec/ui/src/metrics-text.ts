/**
 * The sum of every sample of one metric in Prometheus' text format (all label sets); 0 when the
 * metric is declared (`# TYPE`) but has no sample yet (a labelled counter before its first
 * event); undefined when the text does not have it at all. Summing over labels keeps the
 * create-rate chart right whether the counter is one series or split by backend.
 */
export function sumMetric(text: string, name: string): number | undefined {
  let sum: number | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith(`# TYPE ${name} `)) sum ??= 0;
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== ' ' && rest[0] !== '{') continue; // another metric sharing the prefix
    const afterLabels = rest[0] === '{' ? rest.slice(rest.lastIndexOf('}') + 1) : rest;
    const value = Number(afterLabels.trim().split(/\s+/)[0]);
    if (Number.isFinite(value)) sum = (sum ?? 0) + value;
  }
  return sum;
}
