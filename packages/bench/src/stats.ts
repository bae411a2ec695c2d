/**
 * The two statistics every result uses. The same nearest-rank percentile and rounding as dsec's
 * demo/stats.ts (the demo's figures and the bench's read alike); kept here because the bench
 * imports dsec only through its entry points, and these are not dsec's to export.
 */

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
