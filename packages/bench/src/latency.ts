import { percentile, round } from './stats.js';

/** Latencies in ms: nearest-rank percentiles (demo/stats.ts) plus the mean. */
export interface LatencySummary {
  count: number;
  p50: number;
  p90: number;
  /** Set by summarizeLatency (optional so hand-made summaries in tests need not carry it). */
  p95?: number;
  p99: number;
  min: number;
  max: number;
  mean: number;
}

export function summarizeLatency(values: number[]): LatencySummary {
  if (values.length === 0) return { count: 0, p50: NaN, p90: NaN, p95: NaN, p99: NaN, min: NaN, max: NaN, mean: NaN };
  return {
    count: values.length,
    p50: round(percentile(values, 50), 2),
    p90: round(percentile(values, 90), 2),
    p95: round(percentile(values, 95), 2),
    p99: round(percentile(values, 99), 2),
    // A reduce, not Math.min(...values): spreading 150,000 arguments overflows the stack.
    min: round(
      values.reduce((a, b) => Math.min(a, b), Infinity),
      2,
    ),
    max: round(
      values.reduce((a, b) => Math.max(a, b), -Infinity),
      2,
    ),
    mean: round(values.reduce((a, b) => a + b, 0) / values.length, 2),
  };
}

/** Awaits `fn` and appends its duration in ms to `into`. */
export async function timed<T>(into: number[], fn: () => Promise<T>): Promise<T> {
  const t = performance.now();
  const v = await fn();
  into.push(performance.now() - t);
  return v;
}

export function mean(values: number[]): number {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : NaN;
}
