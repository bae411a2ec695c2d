/** Nearest-rank percentile of a list of numbers (not mutated). */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

export function round(n: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(n * f) / f;
}

export interface Summary {
  count: number;
  p50: number;
  p99: number;
  min: number;
  max: number;
}

export function summarize(values: number[]): Summary {
  return {
    count: values.length,
    p50: round(percentile(values, 50)),
    p99: round(percentile(values, 99)),
    min: round(Math.min(...values)),
    max: round(Math.max(...values)),
  };
}
