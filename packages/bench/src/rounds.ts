/**
 * Round r runs the peers in rotated order (A B, B A, A B …) so that neither always goes first
 * after a settle pause, and noise on this shared host lands on every peer alike.
 */
export function roundOrder<T>(peers: readonly T[], round: number): T[] {
  if (peers.length === 0) return [];
  const k = round % peers.length;
  return [...peers.slice(k), ...peers.slice(0, k)];
}

/** Splits `total` into `rounds` batch sizes that differ by at most one (earlier rounds larger). */
export function batchSizes(total: number, rounds: number): number[] {
  const r = Math.max(1, Math.min(rounds, total));
  const base = Math.floor(total / r);
  return Array.from({ length: r }, (_, i) => base + (i < total % r ? 1 : 0));
}

/** Runs `count` tasks with at most `concurrency` at a time; the first failure rejects after the rest settle. */
export async function pool(count: number, concurrency: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  let firstError: unknown;
  const worker = async (): Promise<void> => {
    while (next < count && firstError === undefined) {
      const i = next++;
      try {
        await task(i);
      } catch (err) {
        firstError ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker));
  if (firstError !== undefined) throw firstError;
}
